//! treecast transport layer.
