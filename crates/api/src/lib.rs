//! treecast api layer.
