// The header included twice, and from two translation units of one C++ program.
#include "treecast.h"
#include "treecast.h"

#include <cstdio>
#include <cstring>

const char *version_from_b();

int main() {
  size_t count = 0;
  uint32_t types[4];
  if (tc_format_types("%d %alf", types, 4, &count) != TC_OK || count != 2 ||
      types[1] != (TC_TYPE_ARRAY | TC_TYPE_DOUBLE)) {
    std::fprintf(stderr, "tc_format_types: %s\n", tc_last_error());
    return 1;
  }
  if (std::strcmp(tc_version(), version_from_b()) != 0) return 1;
  std::printf("two units: ok (treecast %s)\n", tc_version());
  return 0;
}
