//! Reading a configuration: `--config FILE` and the body of `vm.create` are JSON objects of
//! [`VmConfig`]'s fields, and nothing else.
//!
//! A config file must be a regular file of at most [`MAX_CONFIG_BYTES`]: `/dev/zero`, a FIFO
//! or a directory is refused before a byte is read, and a file that grows past the bound while
//! it is read is refused too (the read stops one byte past it). The document must be an
//! object: serde's derived structs also take a JSON array of the fields in order, so `[]`
//! would be the default VM; [`VmConfig`]'s `Deserialize` asks for a map only.

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::ConfigError;
use super::limits::MAX_CONFIG_BYTES;
use super::VmConfig;

impl VmConfig {
    /// Reads a JSON config file: a regular file of at most [`MAX_CONFIG_BYTES`] holding a
    /// JSON object.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        read(path)
    }
}

impl Serialize for VmConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        VmConfig::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for VmConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectOnly)
    }
}

/// Takes a JSON object of fields and nothing else.
struct ObjectOnly;

impl<'de> Visitor<'de> for ObjectOnly {
    type Value = VmConfig;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of VM settings, e.g. {\"cpus\": 2}")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<VmConfig, A::Error> {
        VmConfig::deserialize(MapAccessDeserializer::new(map))
    }
}

/// Reads the JSON config file at `path` (see the module comment for the rules).
pub fn read(path: &Path) -> Result<VmConfig, ConfigError> {
    let err = |source| ConfigError::ReadFile {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let meta = file.metadata().map_err(err)?;
    if !meta.is_file() {
        return Err(ConfigError::NotAFile(path.to_path_buf()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::FileTooLarge(path.to_path_buf()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_CONFIG_BYTES {
        return Err(ConfigError::FileTooLarge(path.to_path_buf()));
    }
    serde_json::from_slice(&bytes).map_err(|source| ConfigError::ParseFile {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lull-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn only_objects_are_configs() {
        for doc in ["[]", "[1, \"256M\"]", "2", "\"cpus\"", "null", "true"] {
            let err = serde_json::from_str::<VmConfig>(doc).unwrap_err();
            assert!(err.to_string().contains("JSON object"), "{doc}: {err}");
        }
        let cfg: VmConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(cfg, VmConfig::default());
        let cfg: VmConfig = serde_json::from_str(r#"{"cpus": 3}"#).unwrap();
        assert_eq!(cfg.cpus, 3);
        let err = serde_json::from_str::<VmConfig>("{\n \"cpu\": 3}").unwrap_err();
        assert_eq!(err.line(), 2, "{err}");
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_before_reading() {
        assert!(matches!(
            read(Path::new("/dev/zero")),
            Err(ConfigError::NotAFile(_))
        ));
        assert!(matches!(
            read(&std::env::temp_dir()),
            Err(ConfigError::NotAFile(_))
        ));
        assert!(matches!(
            read(Path::new("/nonexistent/vm.json")),
            Err(ConfigError::ReadFile { .. })
        ));
    }

    #[test]
    fn files_over_the_bound_are_refused_and_at_it_read() {
        let limit = usize::try_from(MAX_CONFIG_BYTES).unwrap();
        let mut doc = b"{\"cpus\": 2}".to_vec();
        doc.resize(limit, b' ');
        let at = temp("at-bound.json", &doc);
        assert_eq!(read(&at).unwrap().cpus, 2);
        doc.push(b' ');
        let over = temp("over-bound.json", &doc);
        assert!(matches!(read(&over), Err(ConfigError::FileTooLarge(_))));
        let array = temp("array.json", b"[]");
        let err = read(&array).unwrap_err();
        assert!(err.to_string().contains("JSON object"), "{err}");
        std::fs::remove_dir_all(at.parent().unwrap()).unwrap();
    }
}
