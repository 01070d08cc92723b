/* Asynchronous requests: sends and receives started now and completed later, tested,
 * waited for one, any or all at a time, and cancelled without losing a packet. */
#define _DEFAULT_SOURCE
#include <string.h>
#include <time.h>

#include "common.h"

#define N 8

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;
  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  tc_communicator *all = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));
  tc_stream *sum = NULL, *max = NULL;
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
  CHECK(tc_stream_new(net, all, "max", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &max));

  /* A receive posted before anything is sent: not done, and a short wait runs out. */
  tc_request *recv = NULL;
  CHECK(tc_stream_irecv(sum, &recv));
  bool done = true;
  CHECK(tc_request_test(recv, &done));
  EXPECT(!done);
  EXPECT(tc_request_wait(recv, 100) == TC_ERR_TIMEOUT);
  EXPECT(tc_request_wait(recv, 0) == TC_ERR_AGAIN);
  tc_packet *p = NULL;
  EXPECT(tc_request_packet(recv, &p) == TC_ERR_AGAIN && p == NULL);

  /* Sends started together, waited for all at once. */
  tc_request *sends[N];
  for (int32_t k = 0; k < N; k++) CHECK(tc_stream_isend(sum, TAG_SCALE, &sends[k], "%d", k + 1));
  CHECK(tc_request_wait_all((const tc_request *const *)sends, N, 30000));
  for (int k = 0; k < N; k++) {
    EXPECT(tc_request_packet(sends[k], &p) == TC_ERR_INVALID); /* a send has no packet */
    tc_request_free(sends[k]);
  }
  CHECK(tc_request_wait(recv, 30000));
  CHECK(tc_request_packet(recv, &p));
  int32_t v = 0;
  CHECK(tc_packet_unpack(p, "%d", &v));
  EXPECT(v == 1 * 10);
  tc_packet_free(p);
  EXPECT(tc_request_packet(recv, &p) == TC_ERR_INVALID); /* taken once */
  tc_request_free(recv);
  for (int32_t k = 2; k <= N; k++) { /* the other answers are still there, in order */
    CHECK(tc_stream_recv(sum, 30000, &p));
    CHECK(tc_packet_unpack(p, "%d", &v));
    EXPECT(v == k * 10);
    tc_packet_free(p);
  }

  /* Waiting for any of two receives: the one whose stream answers completes. */
  tc_request *either[2];
  CHECK(tc_stream_irecv(sum, &either[0]));
  CHECK(tc_stream_irecv(max, &either[1]));
  CHECK(tc_stream_send(max, TAG_SCALE, "%d", 5));
  size_t index = 99;
  CHECK(tc_request_wait_any((const tc_request *const *)either, 2, 30000, &index));
  EXPECT(index == 1);
  CHECK(tc_request_packet(either[1], &p));
  CHECK(tc_packet_unpack(p, "%d", &v));
  EXPECT(v == 5 * 4);
  tc_packet_free(p);

  /* Cancelling the receive nothing answered: it reports the cancel, and the stream's
   * next packet is not lost to it. */
  CHECK(tc_request_cancel(either[0]));
  EXPECT(tc_request_wait(either[0], 0) == TC_ERR_CANCELLED);
  CHECK(tc_stream_send(sum, TAG_SCALE, "%d", 7));
  CHECK(tc_stream_recv(sum, 30000, &p));
  CHECK(tc_packet_unpack(p, "%d", &v));
  EXPECT(v == 70);
  tc_packet_free(p);
  tc_request_free(either[0]);
  tc_request_free(either[1]);

  /* Freeing a stream closes it even while a receive waits on it: the request ends. */
  tc_stream *lone = NULL;
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &lone));
  tc_request *orphan = NULL;
  CHECK(tc_stream_irecv(lone, &orphan));
  struct timespec pause = {0, 50 * 1000 * 1000}; /* most often the receive waits already */
  nanosleep(&pause, NULL);
  tc_stream_free(lone);
  EXPECT(tc_request_wait(orphan, 30000) == TC_ERR_CLOSED);
  tc_request_free(orphan);

  /* Matched receives on a stream with the null filter (every rank's answer comes up
   * alone): each takes only its tag and rank, and what it skips is still there. */
  tc_stream *each = NULL;
  CHECK(tc_stream_new(net, all, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &each));
  tc_request *odd3 = NULL;
  CHECK(tc_stream_irecv_match(each, TAG_PARITY, 3, &odd3));
  CHECK(tc_stream_send(each, TAG_SCALE, "%d", 3));
  CHECK(tc_stream_send(each, TAG_PARITY, "%d", 0));
  CHECK(tc_request_wait(odd3, 30000));
  CHECK(tc_request_packet(odd3, &p));
  const char *parity = NULL;
  CHECK(tc_packet_unpack(p, "%d %s", &v, &parity));
  EXPECT(tc_packet_tag(p) == TAG_PARITY && tc_packet_rank(p) == 3 && v == 1 && strcmp(parity, "odd") == 0);
  tc_packet_free(p);
  tc_request_free(odd3);
  CHECK(tc_stream_recv_match(each, TAG_SCALE, 2, 30000, &p));
  CHECK(tc_packet_unpack(p, "%d", &v));
  EXPECT(tc_packet_tag(p) == TAG_SCALE && tc_packet_rank(p) == 2 && v == 3 * 3);
  tc_packet_free(p);
  p = NULL;
  EXPECT(tc_stream_recv_match(each, 12345, TC_ANY_RANK, 50, &p) == TC_ERR_TIMEOUT && p == NULL);
  EXPECT(tc_stream_recv_match(each, TC_ANY_TAG, -7, 50, &p) == TC_ERR_INVALID);
  unsigned seen = 0; /* bit (tag == TAG_PARITY) * 4 + rank */
  seen |= 1u << (4 + 3);
  seen |= 1u << 2;
  for (int k = 0; k < 6; k++) {
    CHECK(tc_stream_recv_match(each, TC_ANY_TAG, TC_ANY_RANK, 30000, &p));
    unsigned bit = (tc_packet_tag(p) == TAG_PARITY ? 4u : 0u) + tc_packet_rank(p);
    EXPECT(!(seen & (1u << bit)));
    seen |= 1u << bit;
    tc_packet_free(p);
  }
  EXPECT(seen == 0xff);

  /* A packet goes to the earliest receive posted that matches it: rank 1's one answer
   * to the request posted first, not to the blocking call after it; and a request
   * that never matches holds no later one back. */
  tc_request *never = NULL, *from1 = NULL;
  CHECK(tc_stream_irecv_match(each, 12345, TC_ANY_RANK, &never));
  CHECK(tc_stream_irecv_match(each, TC_ANY_TAG, 1, &from1));
  CHECK(tc_stream_send(each, TAG_SCALE, "%d", 5));
  for (int k = 0; k < 3; k++) { /* ranks 0, 2 and 3, whatever their order */
    CHECK(tc_stream_recv_match(each, TAG_SCALE, TC_ANY_RANK, 30000, &p));
    EXPECT(tc_packet_rank(p) != 1);
    tc_packet_free(p);
  }
  p = NULL;
  EXPECT(tc_stream_recv_match(each, TC_ANY_TAG, 1, 200, &p) == TC_ERR_TIMEOUT && p == NULL);
  CHECK(tc_request_wait(from1, 30000));
  CHECK(tc_request_packet(from1, &p));
  CHECK(tc_packet_unpack(p, "%d", &v));
  EXPECT(tc_packet_rank(p) == 1 && v == 5 * 2);
  tc_packet_free(p);
  bool never_done = true;
  CHECK(tc_request_test(never, &never_done));
  EXPECT(!never_done);
  CHECK(tc_request_cancel(never));
  EXPECT(tc_request_wait(never, 30000) == TC_ERR_CANCELLED);
  tc_request_free(never);
  tc_request_free(from1);
  tc_stream_free(each);

  /* A send refused at once (the wrong kind of value) fails at its start. */
  tc_request *bad = NULL;
  EXPECT(tc_stream_isend(sum, TAG_SCALE, &bad, "%d %", 1) == TC_ERR_FORMAT && bad == NULL);
  EXPECT(tc_request_wait_any(NULL, 0, 10, &index) == TC_ERR_INVALID);

  tc_stream_free(max);
  tc_stream_free(sum);
  tc_communicator_free(all);
  tc_network_free(net);
  printf("requests: ok\n");
  return 0;
}
