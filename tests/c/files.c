/* A file pushed to every back-end with a progress callback: every rank writes a
 * byte-identical copy; a destination folder that does not exist fails on every rank,
 * named in the report, and the call itself still succeeds. */
#define _DEFAULT_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define SIZE (3 * 1024 * 1024 + 17)

struct seen {
  uint64_t calls, max_sent, size, ranks_done, ranks_total;
};

static void progress(void *user, uint64_t sent, uint64_t size, uint64_t ranks_done, uint64_t ranks_total) {
  struct seen *s = user;
  s->calls++;
  if (sent > s->max_sent) s->max_sent = sent;
  s->size = size;
  if (ranks_total) {
    s->ranks_done = ranks_done;
    s->ranks_total = ranks_total;
  }
}

static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = malloc(SIZE + 1);
  EXPECT(buf != NULL);
  *len = fread(buf, 1, SIZE + 1, f);
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  int role = tc_test_role(argc, argv);
  if (role >= 0) return role;

  char dir[] = "/tmp/tc-files-XXXXXX";
  EXPECT(mkdtemp(dir) != NULL);
  char src[PATH_MAX];
  snprintf(src, sizeof src, "%s/src.bin", dir);
  unsigned char *data = malloc(SIZE);
  EXPECT(data != NULL);
  uint32_t x = 0x5eed;
  for (size_t i = 0; i < SIZE; i++) {
    x = x * 1664525u + 1013904223u;
    data[i] = (unsigned char)(x >> 24);
  }
  FILE *f = fopen(src, "wb");
  EXPECT(f != NULL && fwrite(data, 1, SIZE, f) == SIZE && fclose(f) == 0);

  /* The back-ends wait on their descriptors and receive with a time limit of 0, so a
   * receive cut short runs while the file's chunks arrive: none may be lost. */
  static char self[PATH_MAX];
  EXPECT(realpath(argv[0], self) != NULL);
  const char *be_argv[] = {self, "backend-poll"};
  tc_network_options *o = tc_test_options("balanced:2x2", 0, argv[0]);
  CHECK(tc_network_options_set_backend(o, be_argv, 2));
  CHECK(tc_network_options_set_env(o, "TC_TEST_FILES_DIR", dir));
  tc_network *net = NULL;
  CHECK(tc_network_launch(o, &net));
  tc_network_options_free(o);
  tc_communicator *all = NULL;
  CHECK(tc_network_broadcast_communicator(net, &all));

  struct seen seen = {0};
  tc_file_report *report = NULL;
  CHECK(tc_network_bcast_file(net, all, src, "/proc/self/cwd/copy.bin", TC_WRITE_OVERWRITE, progress, &seen,
                              &report));
  if (!tc_file_report_ok(report)) fprintf(stderr, "report: %s\n", tc_file_report_message(report));
  EXPECT(tc_file_report_ok(report));
  EXPECT(strcmp(tc_file_report_ranks(report, TC_FILE_WRITTEN), "0-3") == 0);
  EXPECT(strcmp(tc_file_report_ranks(report, TC_FILE_FAILED), "") == 0);
  EXPECT(tc_file_report_size(report) == SIZE);
  EXPECT(seen.calls > 2 && seen.max_sent == SIZE && seen.size == SIZE);
  EXPECT(seen.ranks_done == 4 && seen.ranks_total == 4);
  tc_file_report_free(report);
  for (int rank = 0; rank < 4; rank++) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s/rank%d/copy.bin", dir, rank);
    size_t len = 0;
    unsigned char *got = read_all(copy, &len);
    EXPECT(got != NULL && len == SIZE && memcmp(got, data, SIZE) == 0);
    free(got);
    EXPECT(unlink(copy) == 0);
  }

  /* Into a folder no rank has: every rank fails, and says why. */
  CHECK(tc_network_bcast_file(net, all, src, "/proc/self/cwd/nofolder/", TC_WRITE_LEAVE, NULL, NULL, &report));
  EXPECT(!tc_file_report_ok(report));
  EXPECT(strcmp(tc_file_report_ranks(report, TC_FILE_FAILED), "0-3") == 0);
  EXPECT(strstr(tc_file_report_message(report), "nofolder") != NULL);
  tc_file_report_free(report);
  EXPECT(tc_network_bcast_file(net, all, "/nonexistent/src", NULL, TC_WRITE_LEAVE, NULL, NULL, &report) ==
         TC_ERR_INVALID);
  EXPECT(strstr(tc_last_error(), "/nonexistent/src") != NULL);

  tc_communicator_free(all);
  tc_network_free(net);
  for (int rank = 0; rank < 4; rank++) {
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s/rank%d", dir, rank);
    EXPECT(rmdir(d) == 0);
  }
  EXPECT(unlink(src) == 0 && rmdir(dir) == 0);
  free(data);
  printf("files: ok\n");
  return 0;
}
