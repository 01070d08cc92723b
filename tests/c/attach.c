/* Attach mode: the front-end launches the comm nodes only and writes the attach file;
 * back-ends started by someone else (here: forked before the launch, as an MPI
 * launcher would start them) join through it, each with its own rank. */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define BACKENDS 4

static int attached_backend(const char *file, int64_t rank) {
  struct stat st;
  for (int i = 0; stat(file, &st) != 0; i++) { /* the file appears once the comm nodes listen */
    if (i > 6000) return 10;
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  tc_backend *be = NULL;
  CHECK(tc_backend_attach(file, rank, &be));
  EXPECT(tc_backend_rank(be) == (uint32_t)rank && tc_backend_size(be) == BACKENDS);
  tc_packet *p = NULL;
  while (tc_backend_recv(be, TC_FOREVER, &p) == TC_OK) {
    int32_t v = 0;
    CHECK(tc_packet_unpack(p, "%d", &v));
    CHECK(tc_backend_send(be, tc_packet_stream(p), TAG_SCALE, "%d", v * (int32_t)(rank + 1)));
    tc_packet_free(p);
  }
  CHECK(tc_backend_close(be));
  return 0;
}

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;
  char dir[] = "/tmp/tc-attach-XXXXXX";
  EXPECT(mkdtemp(dir) != NULL);
  char file[256];
  snprintf(file, sizeof file, "%s/attach", dir);

  pid_t kids[BACKENDS];
  for (int r = 0; r < BACKENDS; r++) {
    kids[r] = fork();
    EXPECT(kids[r] >= 0);
    if (kids[r] == 0) _exit(attached_backend(file, r));
  }

  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  CHECK(tc_network_options_set_attach(o, file, 60000));
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  EXPECT(tc_network_backends(net) == BACKENDS);
  tc_communicator *all = NULL;
  tc_stream *sum = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
  EXPECT(tc_test_scaled(sum, 3) == 3 * (1 + 2 + 3 + 4));
  tc_stream_free(sum);
  tc_communicator_free(all);
  tc_network_free(net);

  for (int r = 0; r < BACKENDS; r++) {
    int status = -1;
    EXPECT(waitpid(kids[r], &status, 0) == kids[r]);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  unlink(file); /* the network removes it; this is in case it did not */
  EXPECT(rmdir(dir) == 0);
  printf("attach: ok\n");
  return 0;
}
