//! treecast topology layer.
