//! The filter registry: transformation filters by name, as every node looks them up
//! when a stream is created.
//!
//! Built-ins are registered by [`FilterRegistry::builtin`]; plug-ins (shared objects
//! loaded at run time) will register through [`FilterRegistry::register`] the same way.

use std::collections::BTreeMap;
use std::sync::Arc;

use treecast_wire::{FilterSpec, Format};

use crate::{builtin, check_format, FilterPlace, RegistryError, Transform, TransformKind, BUILTIN_VERSION};

/// Makes a fresh filter instance for one stream on one node from the stream's parameters.
pub type FilterFactory = dyn Fn(&[u8]) -> Result<Box<dyn Transform>, String> + Send + Sync;
/// Makes a fresh filter instance from the stream's parameters and where it runs.
pub type PlacedFactory = dyn Fn(&[u8], &FilterPlace) -> Result<Box<dyn Transform>, String> + Send + Sync;
/// Checks, at a back-end, that packets of a format can go through the filter.
pub type FormatCheck = dyn Fn(&Format) -> Result<(), crate::FilterError> + Send + Sync;

/// One registered filter.
struct Entry {
    versions: std::ops::RangeInclusive<u16>,
    factory: Arc<PlacedFactory>,
    check: Option<Arc<FormatCheck>>,
}

/// Transformation filters by name. Cheap to clone (entries are shared).
#[derive(Clone, Default)]
pub struct FilterRegistry {
    entries: BTreeMap<String, Arc<Entry>>,
}

impl std::fmt::Debug for FilterRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.entries.keys()).finish()
    }
}

impl FilterRegistry {
    /// A registry holding the built-in filters (version 1, no parameters).
    pub fn builtin() -> Self {
        let mut registry = FilterRegistry::default();
        for kind in TransformKind::ALL {
            let factory = move |params: &[u8]| {
                if params.is_empty() {
                    Ok(builtin(kind))
                } else {
                    Err(format!("takes no parameters, got {} bytes", params.len()))
                }
            };
            let check = move |format: &Format| check_format(kind, format);
            registry.register_checked(kind.name(), BUILTIN_VERSION..=BUILTIN_VERSION, factory, check);
        }
        registry
    }

    /// Registers (or replaces) the filter `name` for the versions it implements; it
    /// takes packets of any format.
    pub fn register(
        &mut self,
        name: &str,
        versions: std::ops::RangeInclusive<u16>,
        factory: impl Fn(&[u8]) -> Result<Box<dyn Transform>, String> + Send + Sync + 'static,
    ) {
        self.register_placed(name, versions, move |params, _| factory(params));
    }

    /// [`FilterRegistry::register`] a filter whose factory is also told where the
    /// instance runs (plug-ins, see the `treecast-plugin` crate).
    pub fn register_placed(
        &mut self,
        name: &str,
        versions: std::ops::RangeInclusive<u16>,
        factory: impl Fn(&[u8], &FilterPlace) -> Result<Box<dyn Transform>, String> + Send + Sync + 'static,
    ) {
        let entry = Entry { versions, factory: Arc::new(factory), check: None };
        self.entries.insert(name.to_owned(), Arc::new(entry));
    }

    /// [`FilterRegistry::register`] a filter that also checks, at the back-ends, the
    /// format of the packets sent to it.
    pub fn register_checked(
        &mut self,
        name: &str,
        versions: std::ops::RangeInclusive<u16>,
        factory: impl Fn(&[u8]) -> Result<Box<dyn Transform>, String> + Send + Sync + 'static,
        check: impl Fn(&Format) -> Result<(), crate::FilterError> + Send + Sync + 'static,
    ) {
        let factory = move |params: &[u8], _: &FilterPlace| factory(params);
        let entry = Entry { versions, factory: Arc::new(factory), check: Some(Arc::new(check)) };
        self.entries.insert(name.to_owned(), Arc::new(entry));
    }

    /// True when a filter of this name is registered (in any version).
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The names of every registered filter, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    fn entry(&self, spec: &FilterSpec) -> Result<&Entry, RegistryError> {
        let entry = self.entries.get(&spec.name).ok_or_else(|| RegistryError::Unknown {
            name: spec.name.clone(),
            known: self.names().collect::<Vec<_>>().join(", "),
        })?;
        if !entry.versions.contains(&spec.version) {
            return Err(RegistryError::Version {
                name: spec.name.clone(),
                found: spec.version,
                low: *entry.versions.start(),
                high: *entry.versions.end(),
            });
        }
        Ok(entry)
    }

    /// A fresh instance of the filter `spec` names, for one stream on one node.
    ///
    /// # Errors
    /// An unknown name, a version the filter does not implement, or parameters it refuses.
    pub fn make(&self, spec: &FilterSpec) -> Result<Box<dyn Transform>, RegistryError> {
        self.make_at(spec, &FilterPlace::default())
    }

    /// [`FilterRegistry::make`] for an instance running at `place`.
    ///
    /// # Errors
    /// As [`FilterRegistry::make`].
    pub fn make_at(
        &self,
        spec: &FilterSpec,
        place: &FilterPlace,
    ) -> Result<Box<dyn Transform>, RegistryError> {
        let entry = self.entry(spec)?;
        (entry.factory)(&spec.params, place)
            .map_err(|detail| RegistryError::Params { name: spec.name.clone(), detail })
    }

    /// Checks that packets of `format` can go through the filter `spec` names
    /// (what a back-end checks before it sends). Filters without a check take any format.
    ///
    /// # Errors
    /// An unknown filter, or the filter's own refusal of the format.
    pub fn check_format(&self, spec: &FilterSpec, format: &Format) -> Result<(), RegistryError> {
        let entry = self.entry(spec)?;
        match &entry.check {
            Some(check) => check(format).map_err(RegistryError::Format),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_found_by_name_and_mistakes_are_named() {
        let r = FilterRegistry::builtin();
        assert!(r.make(&TransformKind::Sum.spec()).is_ok());
        let err = r.make(&FilterSpec::new("median", 1)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("median") && err.contains("sum"), "{err}");
        let err = r.make(&FilterSpec::new("sum", 7)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("version 7"), "{err}");
        let mut spec = TransformKind::Max.spec();
        spec.params = vec![5, 1, 0, 0, 0];
        let err = r.make(&spec).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("max") && err.contains("no parameters"), "{err}");
    }

    #[test]
    fn registered_filters_replace_and_check_formats() {
        let mut r = FilterRegistry::builtin();
        r.register("mine", 1..=3, |_| Ok(builtin(TransformKind::Null)));
        assert!(r.make(&FilterSpec::new("mine", 2)).is_ok());
        let strings = Format::parse("%s").unwrap();
        assert!(r.check_format(&FilterSpec::new("mine", 1), &strings).is_ok());
        assert!(r.check_format(&TransformKind::Sum.spec(), &strings).is_err());
    }
}
