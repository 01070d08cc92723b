//! treecast node layer.
