//! The schema: which actions and context attributes rules may name.

use std::collections::{BTreeMap, HashMap};

use environment_core::{Action, AttrValue};
use serde::{Deserialize, Serialize};

/// The actions every policy knows, in the order of their ids.
pub const BUILTIN_ACTIONS: [&str; 8] = [
    "read", "write", "delete", "execute", "publish", "consume", "approve", "delegate",
];

/// Context attributes core itself sets, declared in every schema.
pub const BUILTIN_ATTRIBUTES: [(&str, AttrType); 2] =
    [("operation", AttrType::String), ("kind", AttrType::String)];

/// The type of a context attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum AttrType {
    /// Text.
    String,
    /// A signed integer.
    Int,
    /// True or false.
    Bool,
}

impl AttrType {
    /// Whether `v` has this type.
    pub fn admits(self, v: &AttrValue) -> bool {
        matches!(
            (self, v),
            (AttrType::String, AttrValue::Str(_))
                | (AttrType::Int, AttrValue::Int(_))
                | (AttrType::Bool, AttrValue::Bool(_))
        )
    }

    /// The type's name as the rule file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AttrType::String => "string",
            AttrType::Int => "int",
            AttrType::Bool => "bool",
        }
    }

    /// The type with this name.
    pub fn parse(s: &str) -> Option<AttrType> {
        match s {
            "string" => Some(AttrType::String),
            "int" => Some(AttrType::Int),
            "bool" => Some(AttrType::Bool),
            _ => None,
        }
    }
}

/// User-defined actions and the typed context attributes conditions may test.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schema {
    /// Actions beyond [`BUILTIN_ACTIONS`].
    pub actions: Vec<String>,
    /// Attributes beyond [`BUILTIN_ATTRIBUTES`].
    pub attributes: BTreeMap<String, AttrType>,
}

/// A dense action number: builtins first, then the schema's actions in order.
pub(crate) type ActionId = u16;

/// The schema prepared for lookups.
#[derive(Debug, Default)]
pub(crate) struct CompiledSchema {
    pub schema: Schema,
    names: Vec<String>,
    by_name: HashMap<String, ActionId>,
}

impl Schema {
    /// The declared type of an attribute (builtins included).
    pub fn attribute(&self, name: &str) -> Option<AttrType> {
        BUILTIN_ATTRIBUTES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .or_else(|| self.attributes.get(name).copied())
    }

    /// Whether rules may name this action.
    pub fn knows_action(&self, name: &str) -> bool {
        BUILTIN_ACTIONS.contains(&name) || self.actions.iter().any(|a| a == name)
    }
}

impl CompiledSchema {
    pub(crate) fn new(schema: Schema) -> CompiledSchema {
        let names: Vec<String> = BUILTIN_ACTIONS
            .iter()
            .map(|s| (*s).to_owned())
            .chain(
                schema
                    .actions
                    .iter()
                    .filter(|a| !BUILTIN_ACTIONS.contains(&a.as_str()))
                    .cloned(),
            )
            .collect();
        let by_name = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as ActionId))
            .collect();
        CompiledSchema {
            schema,
            names,
            by_name,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn name(&self, id: ActionId) -> &str {
        self.names.get(usize::from(id)).map_or("?", String::as_str)
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<ActionId> {
        self.by_name.get(name).copied()
    }

    /// The id of a request's action; builtins without a lookup.
    #[inline]
    pub(crate) fn id_of(&self, a: &Action) -> Option<ActionId> {
        Some(match a {
            Action::Read => 0,
            Action::Write => 1,
            Action::Delete => 2,
            Action::Execute => 3,
            Action::Publish => 4,
            Action::Consume => 5,
            Action::Approve => 6,
            Action::Delegate => 7,
            Action::Custom(s) => return self.by_name(s),
            _ => return None,
        })
    }
}
