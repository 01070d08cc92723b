/*
 * sum_outputs.c: a treecast plug-in filter in C for `treecast run --filter`: adds up
 * the number each command printed, at every node of the tree.
 *
 * The back-ends answer a run request with "%b %b %d %d %uld %uld %b" (stdout first);
 * this filter reads the start of each stdout as a decimal integer and sends up one
 * "%ld %uld": the sum and how many ranks it covers. Its own packets, from comm nodes
 * below, are added in as they are. A stdout that is not a number is refused by rank
 * (the rest is summed). No parameters, no state.
 *
 *   cc -shared -fPIC -I include -o libsum_outputs.so examples/filters/sum_outputs.c
 *   treecast run --local 16 --filter ./libsum_outputs.so:sum_outputs -- nproc
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "treecast_filter.h"
#include "treecast_filter_helpers.h"

static int32_t create(const uint8_t *params, size_t params_len, const treecast_place *place, void **state,
                      char *err, size_t err_len) {
    (void)params;
    (void)place;
    if (params_len != 0) {
        tc_error(err, err_len, "sum_outputs takes no parameters");
        return TREECAST_ERR_PARAMS;
    }
    *state = NULL;
    return TREECAST_OK;
}

/* Reads one packet: a run answer (its stdout as a number) or a partial sum. */
static int read_packet(const treecast_packet *p, int64_t *sum, uint64_t *ranks, char *why, size_t why_len) {
    tc_reader r = tc_reader_of(p->payload, p->payload_len);
    if (strcmp(p->format, "%ld %uld") == 0) {
        if (tc_read_scalar(&r, TC_I64, sum) != 0 || tc_read_scalar(&r, TC_U64, ranks) != 0) return -1;
        return 0;
    }
    uint64_t n;
    const uint8_t *out;
    if (tc_read_bytes(&r, &n, &out) != 0) {
        snprintf(why, why_len, "expected a run answer or \"%%ld %%uld\", got \"%s\"", p->format);
        return -1;
    }
    char text[32] = {0};
    memcpy(text, out, n < sizeof text - 1 ? n : sizeof text - 1);
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || errno != 0 || (*end != 0 && *end != '\n' && *end != ' ')) {
        snprintf(why, why_len, "its output does not start with a number: \"%.20s\"", text);
        return -1;
    }
    *sum = (int64_t)v;
    *ranks = 1;
    return 0;
}

static int32_t reduce(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err,
                      size_t err_len) {
    (void)state;
    (void)place;
    int64_t total = 0;
    uint64_t ranks = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t sum = 0;
        uint64_t count = 0;
        char why[160] = "malformed packet";
        if (read_packet(&packets[i], &sum, &count, why, sizeof why) != 0) {
            tc_error(err, err_len, why);
            *bad_rank = packets[i].rank;
            return TREECAST_ERR_PACKET;
        }
        total += sum;
        ranks += count;
    }
    tc_buf out = {0};
    tc_put_scalar(&out, TC_I64, &total);
    tc_put_scalar(&out, TC_U64, &ranks);
    int32_t code = out.failed ? -1 : host->emit(sink, TREECAST_UP, n > 0 ? packets[0].tag : 0, out.data, out.len);
    tc_buf_free(&out);
    if (code != 0) {
        tc_error(err, err_len, "the node refused the sum");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "sum_outputs", 1, 0, 0,
    create, reduce, tc_no_state, tc_no_params, tc_no_destroy,
};

const treecast_filter_table *treecast_filter_v1(void) { return &table; }
