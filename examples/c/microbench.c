/* The C twin of `treecast bench microbench`: the same round trips (one multicast,
 * one sum) and reductions per second, through libtreecast instead of the Rust API,
 * on the same tree of `treecast node` comm nodes and `treecast backend` back-ends.
 * `treecast bench microbench --c-twin PROGRAM` runs it beside the Rust measurement
 * and prints the ratios; tools/microbench-c builds it and does that.
 *
 *   microbench TREECAST SPEC BACKENDS RT TP
 *
 * TREECAST is the treecast binary, or `-` for this program as its own comm node and
 * back-end; BACKENDS is 0 when SPEC implies it. Prints one JSON line. */
#define _DEFAULT_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "treecast.h"

/* Requests the generic back-end answers too (crates/wire/src/requests.rs), in treecast's own tags. */
#define TAG_ADD_RANK (TC_FIRST_RESERVED_TAG + 3) /* "%d" x: every back-end answers x + rank */
#define TAG_BURST (TC_FIRST_RESERVED_TAG + 7)    /* "%d" n: every back-end answers n packets "%d" 1 */
#define WARMUP 10

#define CHECK(call)                                                                    \
  do {                                                                                 \
    tc_result r_ = (call);                                                             \
    if (r_ != TC_OK) {                                                                 \
      fprintf(stderr, "microbench: %s: %s\n", #call, tc_last_error());                 \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* The back-end's answers, when this program is its own back-end. */
static int backend(void) {
  tc_backend *be;
  CHECK(tc_backend_connect(&be));
  int32_t rank = (int32_t)tc_backend_rank(be);
  tc_packet *p;
  while (tc_backend_recv(be, TC_FOREVER, &p) == TC_OK) {
    int32_t x = 0;
    CHECK(tc_packet_unpack(p, "%d", &x));
    if (tc_packet_tag(p) == TAG_ADD_RANK) {
      CHECK(tc_backend_send(be, tc_packet_stream(p), TAG_ADD_RANK, "%d", x + rank));
    } else if (tc_packet_tag(p) == TAG_BURST) {
      for (int32_t i = 0; i < x; i++) CHECK(tc_backend_send(be, tc_packet_stream(p), TAG_BURST, "%d", 1));
    }
    tc_packet_free(p);
  }
  return tc_backend_close(be) == TC_OK ? 0 : 1;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double percentile(const double *sorted, size_t n, double q) {
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return sorted[i < n ? i : n - 1];
}

int main(int argc, char **argv) {
  if (tc_started_as_comm_node()) return tc_run_comm_node();
  if (argc > 1 && strcmp(argv[1], "backend") == 0) return backend();
  if (argc != 6) {
    fprintf(stderr, "usage: %s TREECAST SPEC BACKENDS RT TP\n", argv[0]);
    return 2;
  }
  const char *treecast = argv[1], *spec = argv[2];
  uint32_t backends = (uint32_t)strtoul(argv[3], NULL, 10);
  size_t rt = strtoul(argv[4], NULL, 10), tp = strtoul(argv[5], NULL, 10);
  if (rt == 0 || tp == 0) {
    fprintf(stderr, "microbench: RT and TP need at least 1 iteration\n");
    return 2;
  }

  static char self[PATH_MAX];
  if (realpath(argv[0], self) == NULL) return 1;
  int own = strcmp(treecast, "-") == 0;
  const char *program = own ? self : treecast;
  const char *be_argv[] = {program, "backend"};
  tc_network_options *o = tc_network_options_new();
  CHECK(tc_network_options_set_topology(o, spec, backends));
  CHECK(tc_network_options_set_treecast_path(o, program));
  CHECK(tc_network_options_set_backend(o, be_argv, 2));
  double t0 = now_us();
  tc_network *net;
  CHECK(tc_network_launch(o, &net));
  double startup_s = (now_us() - t0) / 1e6;
  tc_network_options_free(o);

  // Timed once the global clock's first two rounds are over, as `treecast bench
  // microbench` times: they probe every link and take CPU from the round trips.
  // Past the limit it times anyway, as the Rust benchmark does, and says so.
  char *clock_json = NULL;
  if (tc_network_clock(net, 2, 60000, &clock_json) != TC_OK)
    fprintf(stderr, "microbench: warning: timing while the clock's first rounds may still run: %s\n",
            tc_last_error());
  tc_string_free(clock_json);

  int64_t n = tc_network_backends(net);
  tc_communicator *all;
  tc_stream *sum;
  CHECK(tc_network_broadcast_communicator(net, &all));
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));

  double *rtts = malloc(rt * sizeof *rtts);
  if (rtts == NULL) return 1;
  for (size_t i = 0; i < WARMUP + rt; i++) {
    double t = now_us();
    CHECK(tc_stream_send(sum, TAG_ADD_RANK, "%d", 0));
    tc_packet *p;
    CHECK(tc_stream_recv(sum, 60000, &p));
    double elapsed = now_us() - t;
    int32_t total = -1;
    CHECK(tc_packet_unpack(p, "%d", &total));
    tc_packet_free(p);
    if (total != n * (n - 1) / 2) {
      fprintf(stderr, "microbench: round trip %zu: the sum is %d, expected %lld\n", i, total,
              (long long)(n * (n - 1) / 2));
      return 1;
    }
    if (i >= WARMUP) rtts[i - WARMUP] = elapsed;
  }

  double t = now_us();
  CHECK(tc_stream_send(sum, TAG_BURST, "%d", (int32_t)tp));
  for (size_t i = 0; i < tp; i++) {
    tc_packet *p;
    CHECK(tc_stream_recv(sum, 60000, &p));
    int32_t total = -1;
    CHECK(tc_packet_unpack(p, "%d", &total));
    tc_packet_free(p);
    if (total != n) {
      fprintf(stderr, "microbench: reduction %zu: the sum is %d, expected %lld\n", i, total, (long long)n);
      return 1;
    }
  }
  double tp_s = (now_us() - t) / 1e6;

  double mean = 0;
  for (size_t i = 0; i < rt; i++) mean += rtts[i];
  mean /= (double)rt;
  qsort(rtts, rt, sizeof *rtts, cmp);
  printf("{\"api\":\"c\",\"topology\":\"%s\",\"backends\":%lld,\"instantiation_s\":%.6f,"
         "\"rtt_us_median\":%.3f,\"rtt_us_mean\":%.3f,\"rtt_us_p99\":%.3f,\"reductions_per_s\":%.1f}\n",
         spec, (long long)n, startup_s, percentile(rtts, rt, 0.5), mean, percentile(rtts, rt, 0.99),
         (double)tp / tp_s);
  free(rtts);
  tc_stream_free(sum);
  tc_communicator_free(all);
  tc_network_free(net);
  return 0;
}
