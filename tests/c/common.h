/* What the C API tests share: checks that name the failing line and treecast's
 * message, and the roles one test program plays (front-end, comm node, back-end). */
#ifndef TC_TEST_COMMON_H
#define TC_TEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "treecast.h"

/* Tags the test back-end answers. */
#define TAG_SCALE 1 /* "%d" v: answers "%d" v * (rank + 1) on the same stream */
#define TAG_DIE 2   /* exits at once with status 3, as a crash would */
#define TAG_ECHO 4  /* answers with the packet's values as they came */
#define TAG_STALL 5 /* reads nothing until the file $TC_TEST_RELEASE exists (60 s at most) */
#define TAG_PARITY 6 /* answers "%d %s" rank % 2 and "even" or "odd": two equivalence classes */
#define TAG_PID 7    /* answers "%d" with the back-end's process id */

#define CHECK(call)                                                                     \
  do {                                                                                  \
    tc_result r_ = (call);                                                              \
    if (r_ != TC_OK) {                                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,          \
              tc_result_name(r_), tc_last_error());                                     \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define EXPECT(cond)                                                                    \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);               \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* Runs the role this process was started for, if it is not the front-end: a comm
 * node (`PROGRAM node`) or the test back-end (`PROGRAM backend`). Returns -1 for the
 * front-end, else the exit status. */
int tc_test_role(int argc, char **argv);

/* Sends TAG_SCALE v down `s` and returns the reduction that comes back (30 s at most). */
int32_t tc_test_scaled(const tc_stream *s, int32_t v);

/* Launch options for a local tree of `spec` whose comm nodes and back-ends are this
 * program itself (`argv0`, its argv[0]), with `backends` back-ends (0: as `spec` says). */
tc_network_options *tc_test_options(const char *spec, uint32_t backends, const char *argv0);

#endif
