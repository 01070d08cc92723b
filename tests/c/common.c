/* The roles a test program plays besides its front-end; see common.h. */
#define _DEFAULT_SOURCE
#include "common.h"

#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The next packet: blocking, or through the back-end's descriptor and poll(2). */
static tc_result next_packet(tc_backend *be, int use_poll, tc_packet **p) {
  if (!use_poll) return tc_backend_recv(be, TC_FOREVER, p);
  int fd = -1;
  CHECK(tc_backend_fd(be, &fd));
  for (;;) {
    CHECK(tc_backend_fd_clear(be));
    tc_result r = tc_backend_recv(be, 0, p);
    if (r != TC_ERR_AGAIN) return r;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    EXPECT(poll(&pfd, 1, 60000) == 1); /* something comes within a minute */
  }
}

static int backend(int use_poll) {
  tc_backend *be = NULL;
  CHECK(tc_backend_connect(&be));
  uint32_t rank = tc_backend_rank(be);
  /* Files pushed to /proc/self/cwd/... land in a folder of this rank's own, although
   * every back-end of the test shares one host. */
  const char *files_dir = getenv("TC_TEST_FILES_DIR");
  if (files_dir != NULL) {
    char mine[PATH_MAX];
    snprintf(mine, sizeof mine, "%s/rank%u", files_dir, (unsigned)rank);
    EXPECT(mkdir(mine, 0700) == 0 && chdir(mine) == 0);
  }
  for (;;) {
    tc_packet *p = NULL;
    tc_result r = next_packet(be, use_poll, &p);
    if (r == TC_ERR_CLOSED) break;
    CHECK(r);
    uint32_t stream = tc_packet_stream(p);
    switch (tc_packet_tag(p)) {
    case TAG_SCALE: {
      int32_t v = 0;
      CHECK(tc_packet_unpack(p, "%d", &v));
      CHECK(tc_backend_send(be, stream, TAG_SCALE, "%d", v * (int32_t)(rank + 1)));
      CHECK(tc_backend_flush(be, 30000));
      break;
    }
    case TAG_DIE:
      _exit(3);
    case TAG_STALL: { /* as a back-end stuck in its own work, until the test lets it go */
      const char *release = getenv("TC_TEST_RELEASE");
      struct stat st;
      for (int i = 0; release != NULL && stat(release, &st) != 0 && i < 6000; i++) {
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
      }
      break;
    }
    case TAG_PID:
      CHECK(tc_backend_send(be, stream, TAG_PID, "%d", (int32_t)getpid()));
      break;
    case TAG_PARITY:
      CHECK(tc_backend_send(be, stream, TAG_PARITY, "%d %s", (int32_t)(rank % 2), rank % 2 ? "odd" : "even"));
      break;
    case TAG_ECHO: {
      int32_t n = 0;
      const double *xs = NULL;
      uint32_t len = 0;
      const char *s = NULL;
      const char *const *names = NULL;
      uint32_t names_len = 0;
      CHECK(tc_packet_unpack(p, "%d %alf %s %as", &n, &xs, &len, &s, &names, &names_len));
      CHECK(tc_backend_send(be, stream, TAG_ECHO, "%d %alf %s %as", n + (int32_t)rank, xs, len, s, names,
                            names_len));
      break;
    }
    default:
      break; /* no answer: the front-end's time limits are tested with these */
    }
    tc_packet_free(p);
  }
  CHECK(tc_backend_close(be));
  return 0;
}

int tc_test_role(int argc, char **argv) {
  if (tc_started_as_comm_node()) return tc_run_comm_node();
  if (argc > 1 && strcmp(argv[1], "backend") == 0) return backend(0);
  if (argc > 1 && strcmp(argv[1], "backend-poll") == 0) return backend(1);
  return -1;
}

int32_t tc_test_scaled(const tc_stream *s, int32_t v) {
  CHECK(tc_stream_send(s, TAG_SCALE, "%d", v));
  tc_packet *p = NULL;
  CHECK(tc_stream_recv(s, 30000, &p));
  int32_t total = 0;
  CHECK(tc_packet_unpack(p, "%d", &total));
  tc_packet_free(p);
  return total;
}

tc_network_options *tc_test_options(const char *spec, uint32_t backends, const char *argv0) {
  static char self[PATH_MAX];
  EXPECT(realpath(argv0, self) != NULL);
  tc_network_options *o = tc_network_options_new();
  EXPECT(o != NULL);
  const char *argv[] = {self, "backend"};
  CHECK(tc_network_options_set_topology(o, spec, backends));
  CHECK(tc_network_options_set_backend(o, argv, 2));
  CHECK(tc_network_options_set_treecast_path(o, self));
  return o;
}
