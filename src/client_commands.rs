//! The `dagfold` commands that call a running node's API (API.md, "The
//! command line"), through `client::Client`: `scope`, `member`, `key`,
//! `put`, `delete`, `add`, `get`, `list`, `events`. Each prints the API's
//! answer as one JSON line (`events`: one line per event, for as long as it
//! runs) and fails with the API error's message.

use std::io::{Read, Write as _};
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::client::{Action, Client, Event, Role, API_ADDRESS_FILE, API_TOKEN_FILE};
use crate::node::config::DATA_DIR_DEFAULT;

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error(transparent)]
    Api(#[from] crate::client::Error),
    /// The address or token file is missing or unreadable.
    #[error("{0} (is a node running with this --data-dir? else give --api and --token-file)")]
    Locate(crate::client::Error),
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {what}: {source}")]
    Input { what: String, source: std::io::Error },
}

/// Where the node's API is, and its token: on every client command.
#[derive(Args, Clone, Debug)]
pub struct ApiArgs {
    /// The node's data directory: the API's address is read from
    /// <DATA_DIR>/api-address (the node writes it at each start) and the
    /// token from <DATA_DIR>/api-token.
    #[arg(long, default_value = DATA_DIR_DEFAULT)]
    pub data_dir: PathBuf,
    /// The API's address, HOST:PORT or an http:// URL, instead of the one in
    /// <DATA_DIR>/api-address.
    #[arg(long, value_name = "ADDR_OR_URL")]
    pub api: Option<String>,
    /// The file holding the API token (hex), instead of <DATA_DIR>/api-token
    /// (a node started with --api-token-file FILE: the same FILE).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl ApiArgs {
    pub fn client(&self) -> Result<Client, CommandError> {
        let token_file = self.token_file.clone().unwrap_or_else(|| self.data_dir.join(API_TOKEN_FILE));
        match &self.api {
            Some(api) => Client::with_token_file(api, &token_file),
            None => Client::from_files(&self.data_dir.join(API_ADDRESS_FILE), &token_file),
        }
        .map_err(CommandError::Locate)
    }
}

/// A cell key given on the command line, as text or hex.
#[derive(Args, Clone, Debug)]
pub struct KeyArg {
    /// The item's key: text (its UTF-8 bytes), or hex with --key-hex.
    pub key: String,
    /// KEY is hex (any bytes).
    #[arg(long)]
    pub key_hex: bool,
}

impl KeyArg {
    fn bytes(&self) -> Result<Vec<u8>, CommandError> {
        bytes_arg("KEY", &self.key, self.key_hex)
    }
}

/// Events a data op carries, on `put`, `delete` and `add`.
#[derive(Args, Clone, Debug)]
pub struct EventArgs {
    /// An event the op carries (SPEC §6.6), its kind and its data as text,
    /// e.g. --event note=hello (repeatable: one event each, in order).
    #[arg(long = "event", value_name = "KIND=DATA")]
    pub events: Vec<String>,
}

impl EventArgs {
    fn events(&self) -> Result<Vec<Event>, CommandError> {
        self.events
            .iter()
            .map(|e| match e.split_once('=') {
                Some((kind, data)) if !kind.is_empty() => Ok(Event::new(kind, data)),
                _ => Err(CommandError::Usage(format!("--event takes KIND=DATA, got {e:?}"))),
            })
            .collect()
    }
}

#[derive(Subcommand, Clone, Debug)]
pub enum ClientCommand {
    /// Scopes: create one, list those held here, follow one (API client).
    #[command(subcommand)]
    Scope(ScopeCommand),
    /// A scope's members: list, add, set a role, remove (API client).
    #[command(subcommand)]
    Member(MemberCommand),
    /// A scope's group key: rotate it (API client).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Write one data op that puts VALUE at ENTITY/KEY; print
    /// {"op", "root", "first_event_seq"} (API client).
    Put {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The entity (a name, e.g. "notes").
        entity: String,
        #[command(flatten)]
        key: KeyArg,
        /// The value: text (its UTF-8 bytes), or hex with --value-hex.
        value: String,
        /// VALUE is hex (any bytes).
        #[arg(long)]
        value_hex: bool,
        #[command(flatten)]
        events: EventArgs,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Write one data op that deletes ENTITY/KEY (a tombstone) (API client).
    Delete {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The entity.
        entity: String,
        #[command(flatten)]
        key: KeyArg,
        #[command(flatten)]
        events: EventArgs,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Write one data op that adds AMOUNT to ENTITY/KEY's counter (API
    /// client).
    Add {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The entity.
        entity: String,
        #[command(flatten)]
        key: KeyArg,
        /// A signed 64-bit amount (negative subtracts).
        #[arg(allow_negative_numbers = true)]
        amount: i64,
        #[command(flatten)]
        events: EventArgs,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print the item (SPEC §8 cell) at ENTITY/KEY; fails with `not_found`
    /// if there is none (API client).
    Get {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The entity.
        entity: String,
        #[command(flatten)]
        key: KeyArg,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print one page of ENTITY's items in ascending key-byte order, and
    /// `next_after_hex` for the next page (null at the end) (API client).
    List {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The entity.
        entity: String,
        /// Start after this key (hex): the previous page's next_after_hex.
        #[arg(long, value_name = "HEX")]
        after_hex: Option<String>,
        /// Items per page, 1 to 1000 (the API's default: 100).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print a scope's events as JSON lines, {"seq", "op", "kind",
    /// "data_hex", "data"?}, from --from on, then live until stopped;
    /// resumes by itself after a disconnect or a node restart, without loss
    /// or repetition (API client; `subscribe` is the QUIC one).
    Events {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The first event's sequence number (1: the whole history).
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Exit after printing this many events (without it: run until
        /// stopped).
        #[arg(long)]
        max_events: Option<u64>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand, Clone, Debug)]
pub enum ScopeCommand {
    /// Create a scope with the node as its admin and a fresh group key;
    /// print {"scope", "op"}.
    Create {
        /// The scope's name, for people (it need not be unique).
        name: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print the scopes whose genesis is applied on the node, with its own
    /// role in each (null: not a member).
    List {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Accept this scope's genesis when it arrives from a peer, whoever
    /// made it (the node otherwise accepts only its own and those of
    /// --accept-scopes-from).
    Follow {
        /// The scope id, 64 hex characters.
        scope: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand, Clone, Debug)]
pub enum MemberCommand {
    /// Print the members (sorted by key), the current key id and the key
    /// ids of the scope, as the node's governance heads have them.
    List {
        /// The scope id, 64 hex characters.
        scope: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Add a member and deliver it every key of the scope; print {"op"}.
    /// Its keys from --public-key and --kem-public-key, or from
    /// --identity-json, e.g. `dagfold identity --data-dir B | dagfold member
    /// add SCOPE --identity-json - --role writer`.
    Add {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The member's Ed25519 public key, 64 hex.
        #[arg(long, value_name = "HEX", required_unless_present = "identity_json", conflicts_with = "identity_json")]
        public_key: Option<String>,
        /// The member's X25519 (KEM) public key, 64 hex: its keys are sealed
        /// to it.
        #[arg(long, value_name = "HEX", required_unless_present = "identity_json", conflicts_with = "identity_json")]
        kem_public_key: Option<String>,
        /// A file ("-": standard input) holding {"public_key",
        /// "kem_public_key"}: what `dagfold identity` and GET /v1/identity
        /// print.
        #[arg(long, value_name = "FILE")]
        identity_json: Option<String>,
        /// The member's role: reader, writer or admin.
        #[arg(long)]
        role: Role,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Set a member's role; print {"op"}.
    Role {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The member's public key, 64 hex.
        public_key: String,
        /// The new role: reader, writer or admin.
        role: Role,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Remove a member and rotate the key (one op), delivering the new key
    /// to every remaining member; print {"op"}.
    Remove {
        /// The scope id, 64 hex characters.
        scope: String,
        /// The member's public key, 64 hex.
        public_key: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Subcommand, Clone, Debug)]
pub enum KeyCommand {
    /// Make a fresh group key current and deliver it to every member;
    /// print {"op", "key_id"}.
    Rotate {
        /// The scope id, 64 hex characters.
        scope: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// Runs a client command, printing its answer on standard output.
pub fn run(cmd: ClientCommand) -> Result<(), CommandError> {
    let answer = match cmd {
        ClientCommand::Scope(ScopeCommand::Create { name, api }) => json(api.client()?.create_scope(&name)?),
        ClientCommand::Scope(ScopeCommand::List { api }) => json(api.client()?.scopes()?),
        ClientCommand::Scope(ScopeCommand::Follow { scope, api }) => json(api.client()?.follow(&scope)?),
        ClientCommand::Member(MemberCommand::List { scope, api }) => json(api.client()?.members(&scope)?),
        ClientCommand::Member(MemberCommand::Add { scope, public_key, kem_public_key, identity_json, role, api }) => {
            let (key, kem) = match identity_json {
                Some(source) => keys_from_identity_json(&source)?,
                None => (public_key.unwrap_or_default(), kem_public_key.unwrap_or_default()),
            };
            json(api.client()?.add_member(&scope, &key, &kem, role)?)
        }
        ClientCommand::Member(MemberCommand::Role { scope, public_key, role, api }) => {
            json(api.client()?.set_role(&scope, &public_key, role)?)
        }
        ClientCommand::Member(MemberCommand::Remove { scope, public_key, api }) => json(api.client()?.remove_member(&scope, &public_key)?),
        ClientCommand::Key(KeyCommand::Rotate { scope, api }) => json(api.client()?.rotate_key(&scope)?),
        ClientCommand::Put { scope, entity, key, value, value_hex, events, api } => {
            let action = Action::put(entity, key.bytes()?, bytes_arg("VALUE", &value, value_hex)?);
            json(api.client()?.write(&scope, &[action], &events.events()?)?)
        }
        ClientCommand::Delete { scope, entity, key, events, api } => {
            json(api.client()?.write(&scope, &[Action::delete(entity, key.bytes()?)], &events.events()?)?)
        }
        ClientCommand::Add { scope, entity, key, amount, events, api } => {
            json(api.client()?.write(&scope, &[Action::add(entity, key.bytes()?, amount)], &events.events()?)?)
        }
        ClientCommand::Get { scope, entity, key, api } => json(api.client()?.get_item(&scope, &entity, &key.bytes()?)?),
        ClientCommand::List { scope, entity, after_hex, limit, api } => {
            let after = after_hex.map(|h| bytes_arg("--after-hex", &h, true)).transpose()?;
            json(api.client()?.list_items(&scope, &entity, after.as_deref(), limit)?)
        }
        ClientCommand::Events { scope, from, max_events, api } => {
            return follow_events(&api.client()?, &scope, from, max_events.unwrap_or(u64::MAX))
        }
    };
    println!("{answer}");
    Ok(())
}

/// Prints each event as a line, flushed, until `max_events` are printed,
/// the stream ends with an error or standard output closes (then quietly:
/// a reader went away).
fn follow_events(client: &Client, scope: &str, from: u64, max_events: u64) -> Result<(), CommandError> {
    let mut out = std::io::stdout().lock();
    for event in client.events(scope, from).take(usize::try_from(max_events).unwrap_or(usize::MAX)) {
        let line = json(event?);
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

fn json(answer: impl serde::Serialize) -> String {
    serde_json::to_string(&answer).expect("an answer serializes")
}

/// An argument's bytes: its UTF-8 text, or hex when `is_hex`.
fn bytes_arg(name: &str, value: &str, is_hex: bool) -> Result<Vec<u8>, CommandError> {
    if !is_hex {
        return Ok(value.as_bytes().to_vec());
    }
    hex::decode(value).map_err(|e| CommandError::Usage(format!("{name} is not hex ({e}): {value:?}")))
}

/// The public and KEM keys in `{"public_key", "kem_public_key"}`, read from
/// a file or, for "-", standard input.
fn keys_from_identity_json(source: &str) -> Result<(String, String), CommandError> {
    let what = if source == "-" { "standard input".to_owned() } else { source.to_owned() };
    let mut text = String::new();
    let read = if source == "-" {
        std::io::stdin().lock().read_to_string(&mut text)
    } else {
        std::fs::File::open(source).and_then(|mut f| f.read_to_string(&mut text))
    };
    read.map_err(|source| CommandError::Input { what: what.clone(), source })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CommandError::Usage(format!("--identity-json: {what} is not JSON ({e})")))?;
    match (v["public_key"].as_str(), v["kem_public_key"].as_str()) {
        (Some(key), Some(kem)) => Ok((key.to_owned(), kem.to_owned())),
        _ => Err(CommandError::Usage(format!("--identity-json: {what} has no \"public_key\" and \"kem_public_key\""))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every client command, and each of its arguments, explains itself.
    #[test]
    fn every_command_and_argument_has_help() {
        fn check(cmd: &clap::Command, path: &str) {
            for sub in cmd.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                assert!(sub.get_about().is_some(), "{path} has no help");
                for arg in sub.get_arguments() {
                    let id = arg.get_id().as_str();
                    if id != "help" && id != "version" {
                        assert!(arg.get_help().is_some(), "{path}: {id} has no help");
                    }
                }
                check(sub, &path);
            }
        }
        let cmd = <ClientCommand as clap::Subcommand>::augment_subcommands(clap::Command::new("dagfold"));
        check(&cmd, "dagfold");
    }

    #[test]
    fn events_and_byte_arguments_parse() {
        let e = EventArgs { events: vec!["note=a=b".into()] }.events().unwrap();
        assert_eq!(e, vec![Event::new("note", "a=b")]);
        assert!(EventArgs { events: vec!["=x".into()] }.events().is_err());
        assert_eq!(bytes_arg("KEY", "00ff", true).unwrap(), vec![0, 0xff]);
        assert_eq!(bytes_arg("KEY", "00ff", false).unwrap(), b"00ff".to_vec());
        assert!(bytes_arg("KEY", "zz", true).is_err());
    }
}
