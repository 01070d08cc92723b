/* mrnet/Tree.h: included by mrnet/MRNet.h; the topology generator's classes are not
 * part of treecast's layer (use `treecast topo`, docs/topology-format.md). */
#if !defined(__tree_h)
#define __tree_h 1
#endif
