//! treecast launch layer.
