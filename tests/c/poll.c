/* A tool's own poll(2) loop: the network's descriptor wakes it for packets of two
 * streams and for an event, beside a descriptor of its own (a pipe); the back-ends
 * wait on their descriptors too (`backend-poll`). */
#define _DEFAULT_SOURCE
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;

  static char self[PATH_MAX];
  EXPECT(realpath(argv[0], self) != NULL);
  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  const char *be_argv[] = {self, "backend-poll"};
  CHECK(tc_network_options_set_backend(o, be_argv, 2));
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);

  int fd = -1;
  CHECK(tc_network_fd(net, &fd));
  int fd_again = -1;
  CHECK(tc_network_fd(net, &fd_again));
  EXPECT(fd == fd_again && fd >= 0);
  int tool_pipe[2];
  EXPECT(pipe(tool_pipe) == 0);

  tc_communicator *all = NULL, *three = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));
  CHECK(tc_communicator_new(net, "3", &three));
  tc_stream *sum = NULL, *max = NULL, *die = NULL;
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
  CHECK(tc_stream_new(net, all, "max", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &max));
  CHECK(tc_stream_new(net, three, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &die));

  /* Nothing is pending: the descriptor does not poll readable once cleared. */
  CHECK(tc_network_fd_clear(net));
  struct pollfd quiet = {.fd = fd, .events = POLLIN};
  EXPECT(poll(&quiet, 1, 50) == 0);

  CHECK(tc_stream_send(sum, TAG_SCALE, "%d", 2));
  CHECK(tc_stream_send(max, TAG_SCALE, "%d", 3));
  EXPECT(write(tool_pipe[1], "x", 1) == 1);

  /* Rank 3 dies once both answers are in (a crash loses what it had not sent yet). */
  int got_sum = 0, got_max = 0, got_pipe = 0, got_lost = 0, died = 0;
  while (!(got_sum && got_max && got_pipe && got_lost)) {
    if (got_sum && got_max && !died) {
      CHECK(tc_stream_send(die, TAG_DIE, ""));
      died = 1;
    }
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN}, {.fd = tool_pipe[0], .events = POLLIN}};
    EXPECT(poll(fds, 2, 60000) > 0);
    if (fds[1].revents & POLLIN) {
      char c;
      EXPECT(read(tool_pipe[0], &c, 1) == 1);
      got_pipe = 1;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    CHECK(tc_network_fd_clear(net));
    tc_packet *p = NULL;
    int32_t v = 0;
    tc_result r;
    while ((r = tc_stream_recv(sum, 0, &p)) == TC_OK) {
      CHECK(tc_packet_unpack(p, "%d", &v));
      EXPECT(v == 2 * (1 + 2 + 3 + 4));
      got_sum = 1;
      tc_packet_free(p);
    }
    EXPECT(r == TC_ERR_AGAIN);
    while ((r = tc_stream_recv(max, 0, &p)) == TC_OK) {
      CHECK(tc_packet_unpack(p, "%d", &v));
      EXPECT(v == 3 * 4);
      got_max = 1;
      tc_packet_free(p);
    }
    EXPECT(r == TC_ERR_AGAIN);
    tc_event *e = NULL;
    while ((r = tc_network_next_event(net, 0, &e)) == TC_OK) {
      if (tc_event_kind(e) == TC_EVENT_RANKS_LOST) got_lost = 1;
      tc_event_free(e);
    }
    EXPECT(r == TC_ERR_AGAIN);
  }

  tc_stream_free(die);
  tc_stream_free(max);
  tc_stream_free(sum);
  tc_communicator_free(three);
  tc_communicator_free(all);
  tc_network_free(net);
  close(tool_pipe[0]);
  close(tool_pipe[1]);
  printf("poll: ok\n");
  return 0;
}
