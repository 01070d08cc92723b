/* The integer-addition flow in C: a front-end multicasts a value, every back-end
 * answers value * (rank + 1), the tree sums; then values of every kind go down and
 * come back; then a back-end dies in the middle and the waves complete without it. */
#include <string.h>

#include "common.h"

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;

  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  EXPECT(tc_network_backends(net) == 4);
  EXPECT(tc_network_commnodes(net) == 2);

  tc_communicator *all = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));
  tc_stream *sum = NULL;
  CHECK(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum));
  for (int32_t v = 1; v <= 5; v++) {
    EXPECT(tc_test_scaled(sum, v) == v * (1 + 2 + 3 + 4));
  }

  /* Equivalence classes: the ranks grouped by the values they sent, each class's
   * values read as a packet of their own. */
  tc_stream *classes = NULL;
  CHECK(tc_stream_new(net, all, "eqclass", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &classes));
  CHECK(tc_stream_send(classes, TAG_PARITY, ""));
  tc_packet *table = NULL;
  CHECK(tc_stream_recv(classes, 30000, &table));
  EXPECT(tc_packet_class_count(table) == 2);
  for (size_t i = 0; i < 2; i++) {
    char *ranks = NULL;
    tc_packet *values = NULL;
    CHECK(tc_packet_class(table, i, &ranks, &values));
    int32_t parity = -1;
    const char *word = NULL;
    CHECK(tc_packet_unpack(values, "%d %s", &parity, &word));
    EXPECT(tc_packet_tag(values) == TAG_PARITY && tc_packet_stream(values) == tc_packet_stream(table));
    EXPECT(strcmp(ranks, parity ? "1,3" : "0,2") == 0);
    EXPECT(strcmp(word, parity ? "odd" : "even") == 0);
    tc_string_free(ranks);
    tc_packet_free(values);
  }
  EXPECT(tc_packet_class(table, 2, NULL, NULL) == TC_ERR_RANGE);
  EXPECT(strstr(tc_last_error(), "has 2 classes") != NULL);
  tc_packet_free(table);
  tc_stream_free(classes);

  /* Values of every kind, one back-end at a time (point to point). */
  tc_communicator *two = NULL;
  CHECK(tc_communicator_new(net, "2", &two));
  EXPECT(tc_communicator_size(two) == 1);
  tc_stream *echo = NULL;
  CHECK(tc_stream_new(net, two, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &echo));
  const double xs[] = {0.5, -1.25, 1e300};
  const char *names[] = {"alpha", "", "gamma delta"};
  CHECK(tc_stream_send(echo, TAG_ECHO, "%d %alf %s %as", 40, xs, 3, "héllo", names, 3));
  tc_packet *p = NULL;
  CHECK(tc_stream_recv(echo, 30000, &p));
  EXPECT(tc_packet_rank(p) == 2);
  EXPECT(tc_packet_count(p) == 4);
  EXPECT(tc_packet_type(p, 1) == (TC_TYPE_ARRAY | TC_TYPE_DOUBLE));
  int32_t n = 0;
  const double *ys = NULL;
  uint32_t len = 0;
  const char *s = NULL;
  const char *const *got = NULL;
  uint32_t got_len = 0;
  CHECK(tc_packet_unpack(p, "%d %alf %s %as", &n, &ys, &len, &s, &got, &got_len));
  EXPECT(n == 42);
  EXPECT(len == 3 && ys[0] == 0.5 && ys[1] == -1.25 && ys[2] == 1e300);
  EXPECT(strcmp(s, "héllo") == 0);
  EXPECT(got_len == 3 && strcmp(got[0], "alpha") == 0 && strcmp(got[1], "") == 0 &&
         strcmp(got[2], "gamma delta") == 0);
  EXPECT(tc_packet_class_count(p) == 0);
  EXPECT(tc_packet_class(p, 0, NULL, NULL) == TC_ERR_FORMAT);
  EXPECT(strstr(tc_last_error(), "not an equivalence-class table") != NULL);
  tc_packet_free(p);
  tc_stream_free(echo);
  tc_communicator_free(two);

  /* A rank lost in the middle: rank 3 dies, the front-end hears of it, and the next
   * waves complete with the three ranks left. */
  tc_communicator *three = NULL;
  CHECK(tc_communicator_new(net, "3", &three));
  tc_stream *die = NULL;
  CHECK(tc_stream_new(net, three, NULL, NULL, TC_SYNC_DO_NOT_WAIT, 0, &die));
  CHECK(tc_stream_send(die, TAG_DIE, ""));
  int lost = 0;
  while (!lost) {
    tc_event *e = NULL;
    CHECK(tc_network_next_event(net, 30000, &e));
    if (tc_event_kind(e) == TC_EVENT_RANKS_LOST) {
      EXPECT(strcmp(tc_event_ranks(e), "3") == 0);
      EXPECT(strlen(tc_event_message(e)) > 0);
      lost = 1;
    }
    tc_event_free(e);
  }
  EXPECT(tc_test_scaled(sum, 1) == 1 + 2 + 3);

  tc_stream_free(die);
  tc_communicator_free(three);
  tc_stream_free(sum);
  tc_communicator_free(all);
  tc_network_free(net);
  printf("sum: ok\n");
  return 0;
}
