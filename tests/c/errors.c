/* Every error path of the C API: each failing call returns its code, writes no
 * out-parameter, and leaves a message on this thread only. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

/* Expects `call` to fail with `code` and a message holding `words`. */
#define FAILS(call, code, words)                                                        \
  do {                                                                                  \
    tc_result r_ = (call);                                                              \
    if (r_ != (code) || strstr(tc_last_error(), (words)) == NULL) {                     \
      fprintf(stderr, "%s:%d: %s gave %s (%s), expected %s with \"%s\"\n", __FILE__,     \
              __LINE__, #call, tc_result_name(r_), tc_last_error(), #code, (words));     \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* A back-end this test stopped, let go again at exit whatever happens, so that no
 * process of the tree stays stopped behind a failed check. */
static pid_t stopped = 0;

static void let_go(void) {
  if (stopped > 0) kill(stopped, SIGCONT);
  stopped = 0;
}

/* A flush whose peer takes nothing runs out of time with TC_ERR_TIMEOUT and says
 * what to do. Rank 0's process is stopped (SIGSTOP), so no byte leaves the kernel's
 * buffers of its link; streams to it are filled to their windows until the buffers
 * cannot hold what was sent (a flush of 100 ms that still succeeds only means they
 * could: then one more stream is filled). The timeout firing is what is tested, not
 * a sleep's length. */
static void flush_runs_out_of_time(tc_network *net, tc_communicator *zero, tc_stream *to_zero) {
  CHECK(tc_stream_send(to_zero, TAG_PID, ""));
  tc_packet *p = NULL;
  CHECK(tc_stream_recv(to_zero, 30000, &p));
  int32_t pid = 0;
  CHECK(tc_packet_unpack(p, "%d", &pid));
  tc_packet_free(p);
  EXPECT(pid > 0);
  enum { STREAMS = 12 }; /* 12 windows of 8 MiB: more than any loopback link buffers */
  tc_stream *more[STREAMS] = {0};
  for (int k = 0; k < STREAMS; k++) CHECK(tc_stream_new(net, zero, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &more[k]));
  EXPECT(atexit(let_go) == 0);
  stopped = (pid_t)pid;
  EXPECT(kill(stopped, SIGSTOP) == 0);
  static unsigned char blob[512 * 1024];
  tc_result flushed = TC_OK;
  for (int k = 0; k < STREAMS && flushed == TC_OK; k++) {
    tc_result r = TC_OK;
    for (int i = 0; i < 64 && r == TC_OK; i++) r = tc_stream_send(more[k], 99, "%b", blob, (uint32_t)sizeof blob);
    EXPECT(r == TC_ERR_TIMEOUT); /* the stream's window is full */
    flushed = tc_network_flush(net, 100);
  }
  EXPECT(flushed == TC_ERR_TIMEOUT);
  EXPECT(strstr(tc_last_error(), "not all written out after 100 ms") != NULL);
  EXPECT(strstr(tc_last_error(), "is not reading; wait longer, or go on") != NULL);
  FAILS(tc_network_flush(net, 0), TC_ERR_AGAIN, "not all written out after 0 ms");
  let_go();
  CHECK(tc_network_flush(net, 60000)); /* the back-end reads again: everything goes out */
  for (int k = 0; k < STREAMS; k++) tc_stream_free(more[k]);
}

static void *other_thread(void *arg) {
  (void)arg;
  /* The message of the main thread's last failure is not this thread's. */
  return (void *)(strcmp(tc_last_error(), "") == 0 ? "clean" : "dirty");
}

static void without_a_network(void) {
  tc_network *net = (tc_network *)0x1; /* must stay as it is */
  FAILS(tc_network_launch(NULL, &net), TC_ERR_NULL, "options is NULL");
  EXPECT(net == (tc_network *)0x1);

  tc_network_options *o = tc_network_options_new();
  FAILS(tc_network_launch(o, &net), TC_ERR_INVALID, "tc_network_options_set_topology");
  EXPECT(net == (tc_network *)0x1);
  FAILS(tc_network_options_set_topology(o, "balanced:4y4", 0), TC_ERR_INVALID, "balanced:4y4");
  FAILS(tc_network_options_set_topology(o, NULL, 0), TC_ERR_NULL, "spec is NULL");
  FAILS(tc_network_options_set_launcher(o, "pbs"), TC_ERR_INVALID, "\"local\", \"ssh\" or \"slurm\"");
  FAILS(tc_network_options_set_route(o, "ib"), TC_ERR_INVALID, "\"striped:N\" or \"mptcp\"");
  FAILS(tc_network_options_set_route(o, "striped:17"), TC_ERR_INVALID, "N from 2 to 16");
  /* Rails: subnets or interface names, each checked as it is set. */
  FAILS(tc_network_options_set_rails(o, "10.1.0.0/33"), TC_ERR_INVALID, "\"10.1.0.0/33\"");
  FAILS(tc_network_options_set_rails(o, "ib0,10.1.0/16"), TC_ERR_INVALID, "not an IP address");
  EXPECT(tc_network_options_set_rails(o, "10.1.0.0/16, ib1") == TC_OK);
  EXPECT(tc_network_options_set_rails(o, NULL) == TC_OK);
  /* A stream chooses among the network's routes, not sockets or connection counts. */
  tc_stream *routed = NULL;
  FAILS(tc_stream_new_routed(NULL, NULL, NULL, NULL, 0, 0, "mptcp", &routed), TC_ERR_INVALID, "are the network's");
  FAILS(tc_stream_new_routed(NULL, NULL, NULL, NULL, 0, 0, "ib", &routed), TC_ERR_INVALID, "tcp, udp, striped");
  FAILS(tc_network_options_set_hosts(o, "node[05-01]", 0, 0), TC_ERR_INVALID, "node[05-01]");
  /* A stall limit out of range stops the launch before a process starts. */
  tc_network_options *stall = tc_network_options_new();
  EXPECT(tc_network_options_set_topology(stall, "flat", 1) == TC_OK);
  EXPECT(tc_network_options_set_route(stall, "striped:2") == TC_OK);
  EXPECT(tc_network_options_set_stripe_stall(stall, 1) == TC_OK);
  FAILS(tc_network_launch(stall, &net), TC_ERR_INVALID, "tc_network_options_set_stripe_stall");
  EXPECT(net == (tc_network *)0x1);
  tc_network_options_free(stall);
  FAILS(tc_network_options_set_backend(o, NULL, 0), TC_ERR_INVALID, "argc is 0");
  const char *bad_utf8[] = {"\xff\xfe"};
  FAILS(tc_network_options_set_backend(o, bad_utf8, 1), TC_ERR_INVALID, "argv[0] is not UTF-8");

  char path[] = "/tmp/tc-topology-XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("fe:0 => cn:0 ;\ncn:0 => be:0 be:0 ;\n", f);
  fclose(f);
  FAILS(tc_network_options_set_topology_file(o, path), TC_ERR_INVALID, "line 2");
  unlink(path);
  tc_network_options_free(o);

  size_t count = 99;
  uint32_t types[4];
  FAILS(tc_format_types("%d %q", types, 4, &count), TC_ERR_FORMAT, "column 4");
  EXPECT(count == 99);
  FAILS(tc_format_types("%d %d %d %d %d", types, 4, &count), TC_ERR_RANGE, "5 values");
  CHECK(tc_format_types("%uhd %as %b", types, 4, &count));
  EXPECT(count == 3 && types[0] == TC_TYPE_USHORT && types[1] == (TC_TYPE_ARRAY | TC_TYPE_STRING) &&
         types[2] == TC_TYPE_BYTES);

  /* NULL handles: getters answer a neutral value, destructors do nothing. */
  EXPECT(tc_network_backends(NULL) == 0);
  EXPECT(tc_packet_count(NULL) == 0);
  EXPECT(tc_packet_rank(NULL) == UINT32_MAX);
  EXPECT(tc_event_kind(NULL) == TC_EVENT_NONE);
  EXPECT(strcmp(tc_result_name(99), "TC_ERR_UNKNOWN") == 0);
  EXPECT(strcmp(tc_result_name(TC_ERR_CANCELLED), "TC_ERR_CANCELLED") == 0);
  tc_network_free(NULL);
  tc_stream_free(NULL);
  tc_packet_free(NULL);
  tc_event_free(NULL);
  CHECK(tc_backend_close(NULL));

  /* A back-end not started by treecast says which variable it lacks. */
  tc_backend *be = NULL;
  FAILS(tc_backend_connect(&be), TC_ERR_NOT_LAUNCHED, "TREECAST_");
  EXPECT(be == NULL);
  uint32_t closed_id = 0;
  FAILS(tc_backend_next_closed(NULL, &closed_id), TC_ERR_NULL, "be is NULL");
  FAILS(tc_backend_flush(NULL, 0), TC_ERR_NULL, "be is NULL");
  FAILS(tc_network_flush(NULL, 0), TC_ERR_NULL, "net is NULL");

  FAILS(tc_format_types("%d %q", types, 4, &count), TC_ERR_FORMAT, "%q");
  pthread_t t;
  void *answer = NULL;
  EXPECT(pthread_create(&t, NULL, other_thread, NULL) == 0);
  EXPECT(pthread_join(t, &answer) == 0);
  EXPECT(strcmp((const char *)answer, "clean") == 0);
}

static void with_a_network(const char *argv0) {
  char release[] = "/tmp/tc-release-XXXXXX";
  int release_fd = mkstemp(release);
  EXPECT(release_fd >= 0 && close(release_fd) == 0 && unlink(release) == 0);
  tc_network_options *o = tc_test_options("flat", 2, argv0);
  CHECK(tc_network_options_set_send_timeout(o, 300));
  CHECK(tc_network_options_set_env(o, "TC_TEST_RELEASE", release));
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);

  tc_communicator *comm = NULL;
  FAILS(tc_communicator_new(net, "0-99", &comm), TC_ERR_RANGE, "2-99");
  FAILS(tc_communicator_new(net, "zero", &comm), TC_ERR_INVALID, "zero");
  EXPECT(comm == NULL);
  CHECK(tc_network_broadcast_communicator(net, &comm));
  tc_stream *s = NULL;
  FAILS(tc_stream_new(net, comm, "sum", NULL, 7, 0, &s), TC_ERR_INVALID, "no sync mode 7");
  /* Creation parameters are checked against their format; the sum takes none. */
  tc_value param = {0};
  param.kind = TC_TYPE_DOUBLE;
  FAILS(tc_stream_new_params(net, comm, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, "%d", &param, 1, &s), TC_ERR_FORMAT,
        "value 1 (%d)");
  FAILS(tc_stream_new_params(net, comm, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, NULL, NULL, 0, &s), TC_ERR_NULL,
        "format is NULL");
  EXPECT(s == NULL);
  CHECK(tc_stream_new(net, comm, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &s));

  /* A bad format string, the wrong kind of value, a value that does not fit. */
  FAILS(tc_stream_send(s, TAG_SCALE, "%d %", 1), TC_ERR_FORMAT, "column 4");
  tc_value v = {0};
  v.kind = TC_TYPE_DOUBLE;
  v.d = 1.5;
  FAILS(tc_stream_send_values(s, TAG_SCALE, "%d", &v, 1), TC_ERR_FORMAT, "value 1 (%d)");
  v.kind = TC_TYPE_INT;
  v.i = (int64_t)1 << 40;
  FAILS(tc_stream_send_values(s, TAG_SCALE, "%d", &v, 1), TC_ERR_RANGE, "does not fit in 32 bits");
  FAILS(tc_stream_send_values(s, TAG_SCALE, "%d %d", &v, 1), TC_ERR_FORMAT, "names 2 values and 1 were given");
  v.kind = TC_TYPE_STRING;
  v.ptr = NULL;
  FAILS(tc_stream_send_values(s, TAG_SCALE, "%s", &v, 1), TC_ERR_FORMAT, "the string is NULL");

  /* Time limits: 0 looks once, a limit runs out; nothing answers tag 99. */
  tc_packet *p = NULL;
  FAILS(tc_stream_recv(s, 0, &p), TC_ERR_AGAIN, "no packet is ready");
  CHECK(tc_stream_send(s, 99, ""));
  FAILS(tc_stream_recv(s, 200, &p), TC_ERR_TIMEOUT, "200 ms");
  EXPECT(p == NULL);
  FAILS(tc_stream_recv(s, 100, NULL), TC_ERR_NULL, "out is NULL");
  tc_event *e = NULL;
  FAILS(tc_network_next_event(net, 0, &e), TC_ERR_AGAIN, "no event");

  /* Reading a packet as what it is not. */
  tc_stream_free(s);
  CHECK(tc_stream_new(net, comm, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &s));
  CHECK(tc_stream_send(s, TAG_SCALE, "%d", 3));
  CHECK(tc_stream_recv(s, 30000, &p));
  double d = -1;
  FAILS(tc_packet_unpack(p, "%lf", &d), TC_ERR_FORMAT, "%d");
  EXPECT(d == -1);
  FAILS(tc_packet_get_f64(p, 0, &d), TC_ERR_FORMAT, "value 0 is %d");
  int64_t i = 0;
  FAILS(tc_packet_get_i64(p, 1, &i), TC_ERR_RANGE, "index 1");
  CHECK(tc_packet_get_i64(p, 0, &i));
  EXPECT(i == 3 * (1 + 2));
  tc_packet_free(p);

  FAILS(tc_network_load_filter(net, "/nonexistent/libfilter.so"), TC_ERR_PLUGIN, "/nonexistent/libfilter.so");

  /* A back-end that stops reading: once its window is full, a send fails after the
   * network's send limit (300 ms here) instead of hanging the tool. */
  tc_communicator *zero = NULL;
  CHECK(tc_communicator_new(net, "0", &zero));
  tc_stream *stuck = NULL;
  CHECK(tc_stream_new(net, zero, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &stuck));
  CHECK(tc_stream_send(stuck, TAG_STALL, ""));
  static unsigned char blob[512 * 1024];
  tc_result r = TC_OK;
  for (int k = 0; k < 200 && r == TC_OK; k++) r = tc_stream_send(stuck, 99, "%b", blob, (uint32_t)sizeof blob);
  EXPECT(r == TC_ERR_TIMEOUT);
  EXPECT(strstr(tc_last_error(), "window stayed full for 300 ms") != NULL);
  FILE *go = fopen(release, "w"); /* the back-end reads again */
  EXPECT(go != NULL && fclose(go) == 0);
  CHECK(tc_network_flush(net, 30000)); /* what the window let through is written out */
  flush_runs_out_of_time(net, zero, stuck);
  tc_stream_free(stuck);
  tc_communicator_free(zero);
  EXPECT(unlink(release) == 0);
  tc_stream_free(s);
  tc_communicator_free(comm);
  tc_network_free(net);
}

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;
  without_a_network();
  with_a_network(argv[0]);
  printf("errors: ok\n");
  return 0;
}
