//! treecast filters layer.
