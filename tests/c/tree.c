/* The rest of the front-end: the tree's shape, back-ends spawned while it runs (and
 * a stream to them), the global clock's table and a monitoring report. */
#define _DEFAULT_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;
  static char self[PATH_MAX];
  EXPECT(realpath(argv[0], self) != NULL);
  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);

  char *topology = NULL;
  CHECK(tc_network_topology(net, &topology));
  EXPECT(strstr(topology, "=>") != NULL && strchr(topology, ';') != NULL);
  tc_string_free(topology);
  EXPECT(tc_network_depth(net) == 2);

  /* Two more back-ends, then a sum over them alone: ranks 4 and 5 answer v * 5 and v * 6. */
  const char *be_argv[] = {self, "backend"};
  uint32_t group = 0;
  tc_communicator *spawned = NULL;
  CHECK(tc_network_spawn(net, 2, be_argv, 2, &group, &spawned));
  EXPECT(group > 0);
  EXPECT(tc_communicator_size(spawned) == 2);
  EXPECT(tc_network_backends(net) == 6);
  tc_stream *sum = NULL;
  CHECK(tc_stream_new(net, spawned, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));

  CHECK(tc_network_monitor_start(net, 7));
  for (int32_t v = 1; v <= 3; v++) {
    EXPECT(tc_test_scaled(sum, v) == v * (5 + 6));
  }
  CHECK(tc_network_monitor_stop(net));
  char *report = NULL;
  CHECK(tc_network_monitor_collect(net, false, 30000, &report));
  EXPECT(report[0] == '{' && strstr(report, "\"missing\"") != NULL);
  tc_string_free(report);

  char *clock = NULL;
  CHECK(tc_network_clock(net, 1, 60000, &clock));
  EXPECT(clock[0] == '[' && strstr(clock, "\"offset_ns\"") != NULL && strstr(clock, "\"error_ns\"") != NULL);
  tc_string_free(clock);

  const char *nothing[] = {NULL};
  EXPECT(tc_network_spawn(net, 1, nothing, 0, &group, &spawned) == TC_ERR_INVALID);
  tc_string_free(NULL);

  tc_stream_free(sum);
  tc_communicator_free(spawned);
  tc_network_free(net);

  /* A tree over a host list (this host, three back-ends on it), linked over TCP. */
  o = tc_test_options("flat", 1, argv[0]);
  CHECK(tc_network_options_set_hosts(o, "localhost", 2, 3));
  CHECK(tc_network_options_set_route(o, "tcp"));
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  EXPECT(tc_network_backends(net) == 3);
  tc_communicator *all = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
  EXPECT(tc_test_scaled(sum, 1) == 1 + 2 + 3);
  tc_stream_free(sum);
  tc_communicator_free(all);
  tc_network_free(net);

  /* The same over striped links (two connections per link), then over Multipath TCP
   * (plain TCP where the kernel refuses it). */
  const char *routes[] = {"striped:2", "mptcp"};
  for (int i = 0; i < 2; i++) {
    o = tc_test_options("balanced:2x2", 4, argv[0]);
    CHECK(tc_network_options_set_route(o, "tcp"));
    CHECK(tc_network_options_set_route(o, routes[i]));
    /* Rails are for links to other hosts: a local tree takes them and keeps its sockets. */
    CHECK(tc_network_options_set_rails(o, "127.0.0.0/8,lo"));
    CHECK(tc_network_launch(o, &net));
    tc_network_options_free(o);
    CHECK(tc_network_broadcast_communicator(net, &all));
    CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
    EXPECT(tc_test_scaled(sum, 2) == 2 * (1 + 2 + 3 + 4));
    tc_stream_free(sum);
    /* A stream that keeps its frames whole on one connection of each link. */
    CHECK(tc_stream_new_routed(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, "tcp", &sum));
    EXPECT(tc_test_scaled(sum, 3) == 3 * (1 + 2 + 3 + 4));
    tc_stream_free(sum);
    /* Striped links carry a striped stream; no multicast groups, no udp stream. */
    int striped = i == 0;
    tc_result r = tc_stream_new_routed(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, "striped", &sum);
    EXPECT(r == (striped ? TC_OK : TC_ERR_INVALID));
    if (r == TC_OK) {
      EXPECT(tc_test_scaled(sum, 4) == 4 * (1 + 2 + 3 + 4));
      tc_stream_free(sum);
    }
    EXPECT(tc_stream_new_routed(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, "udp", &sum) == TC_ERR_INVALID);
    EXPECT(strstr(tc_last_error(), "--route udp") != NULL);
    tc_communicator_free(all);
    tc_network_free(net);
  }
  printf("tree: ok\n");
  return 0;
}
