/* Handles used from several threads at once: four threads send and receive on one
 * stream, a fifth makes and frees streams of its own on the same network, and a
 * sixth waits for events meanwhile. Every answer arrives exactly once. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"

#define SENDERS 4
#define WAVES 25

static tc_network *net;
static tc_communicator *all;
static tc_stream *shared_stream;
static int32_t answers[SENDERS * WAVES];
static atomic_int answered;
static atomic_int done;

static void *sender(void *arg) {
  int32_t id = (int32_t)(intptr_t)arg;
  for (int32_t k = 0; k < WAVES; k++) {
    CHECK(tc_stream_send(shared_stream, TAG_SCALE, "%d", id * 1000 + k + 1));
    tc_packet *p = NULL;
    CHECK(tc_stream_recv(shared_stream, 30000, &p));
    int32_t total = 0;
    CHECK(tc_packet_unpack(p, "%d", &total));
    answers[atomic_fetch_add(&answered, 1)] = total;
    tc_packet_free(p);
  }
  return NULL;
}

static void *stream_maker(void *arg) {
  (void)arg;
  for (int k = 0; k < 20; k++) {
    tc_stream *s = NULL;
    CHECK(tc_stream_new(net, all, "max", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &s));
    CHECK(tc_stream_send(s, TAG_SCALE, "%d", 1));
    tc_packet *p = NULL;
    CHECK(tc_stream_recv(s, 30000, &p));
    int32_t most = 0;
    CHECK(tc_packet_unpack(p, "%d", &most));
    EXPECT(most == 4);
    tc_packet_free(p);
    tc_stream_free(s);
  }
  return NULL;
}

static void *event_waiter(void *arg) {
  (void)arg;
  while (!atomic_load(&done)) {
    tc_event *e = NULL;
    tc_result r = tc_network_next_event(net, 50, &e);
    EXPECT(r == TC_ERR_TIMEOUT); /* nothing happens to this tree */
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;
  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  CHECK(tc_network_broadcast_communicator(net, &all));
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &shared_stream));

  pthread_t threads[SENDERS + 2];
  for (intptr_t i = 0; i < SENDERS; i++) EXPECT(pthread_create(&threads[i], NULL, sender, (void *)i) == 0);
  EXPECT(pthread_create(&threads[SENDERS], NULL, stream_maker, NULL) == 0);
  EXPECT(pthread_create(&threads[SENDERS + 1], NULL, event_waiter, NULL) == 0);
  for (int i = 0; i < SENDERS + 1; i++) EXPECT(pthread_join(threads[i], NULL) == 0);
  atomic_store(&done, 1);
  EXPECT(pthread_join(threads[SENDERS + 1], NULL) == 0);

  /* Each sum is 10 times a value sent; every value's sum came back once. */
  EXPECT(atomic_load(&answered) == SENDERS * WAVES);
  int32_t expected[SENDERS * WAVES];
  for (int32_t id = 0; id < SENDERS; id++)
    for (int32_t k = 0; k < WAVES; k++) expected[id * WAVES + k] = 10 * (id * 1000 + k + 1);
  qsort(answers, SENDERS * WAVES, sizeof answers[0], cmp);
  qsort(expected, SENDERS * WAVES, sizeof expected[0], cmp);
  EXPECT(memcmp(answers, expected, sizeof expected) == 0);

  tc_stream_free(shared_stream);
  tc_communicator_free(all);
  tc_network_free(net);
  printf("threads: ok\n");
  return 0;
}
