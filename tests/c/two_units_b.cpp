// The second translation unit of two_units_a.cpp: the header's inline functions
// must not clash at link time.
#include "treecast.h"

const char *version_from_b() { return tc_version(); }
