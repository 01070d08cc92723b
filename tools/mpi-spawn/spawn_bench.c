/* The MPI reference of `treecast bench spawn`: MPI-2 dynamic process management
 * with the MPI library of this machine, timed the same way as treecast's spawns.
 *
 *   spawn_bench latency N RUNS   time MPI_Comm_spawn of N processes, RUNS times
 *   spawn_bench rate N SECS      spawn N at a time for SECS seconds, keeping them
 *   spawn_bench merge N          (under mpirun -n N) spawn N more, time the merge
 *   spawn_bench pingpong-inter SIZE ROUNDS   spawn 1, ping-pong SIZE bytes with it
 *   spawn_bench pingpong-intra SIZE ROUNDS   (under mpirun -n 2) ping-pong in the job
 *   spawn_bench collectives N SIZES ROUNDS   (under mpirun -n N) spawn N more, merge,
 *       then time all-reduce, reduce (spawned group to rank 0 of the job, over the
 *       intercommunicator), all-gather, reduce-scatter and barrier for each size
 *       (comma-separated bytes per member), ROUNDS times after one warm-up
 *
 * Each mode prints `key value` lines on stdout. Spawned copies of this program
 * find their parent with MPI_Comm_get_parent and act on their first argument. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Answers `rounds` messages of `size` bytes from `peer` on `comm` with the same bytes. */
static void echo(MPI_Comm comm, int peer, int size, int rounds) {
    char *buf = malloc(size > 0 ? size : 1);
    for (int r = 0; r < rounds; r++) {
        MPI_Recv(buf, size, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE);
        MPI_Send(buf, size, MPI_BYTE, peer, 0, comm);
    }
    free(buf);
}

/* Sends `rounds` messages of `size` bytes to `peer` and waits for each back; prints
 * the mean one-way latency. */
static void ping(MPI_Comm comm, int peer, int size, int rounds) {
    char *buf = calloc(size > 0 ? size : 1, 1);
    MPI_Send(buf, size, MPI_BYTE, peer, 0, comm); /* a warm-up round */
    MPI_Recv(buf, size, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE);
    double t0 = MPI_Wtime();
    for (int r = 0; r < rounds; r++) {
        MPI_Send(buf, size, MPI_BYTE, peer, 0, comm);
        MPI_Recv(buf, size, MPI_BYTE, peer, 0, comm, MPI_STATUS_IGNORE);
    }
    printf("one_way_us %.3f\n", (MPI_Wtime() - t0) * 1e6 / rounds / 2);
    free(buf);
}

/* Mean microseconds of one operation, `rounds` times after a warm-up, over every
 * size; rank 0 of `merged` prints min, mean and max across its processes. The
 * parent group (`high` 0) holds the reduction's root, its rank 0. */
static void collectives(MPI_Comm inter, int high, const char *sizes_text, int rounds) {
    MPI_Comm merged;
    MPI_Intercomm_merge(inter, high, &merged);
    int rank, n, local;
    MPI_Comm_rank(merged, &rank);
    MPI_Comm_size(merged, &n);
    MPI_Comm_rank(inter, &local);
    static const char *names[] = {"allreduce", "reduce", "allgather", "reducescatter", "barrier"};
    char *sizes = strdup(sizes_text);
    for (char *item = strtok(sizes, ","); item; item = strtok(NULL, ",")) {
        int bytes = atoi(item);
        int count = bytes / 8 > 0 ? bytes / 8 : 1;
        int block = count / n > 0 ? count / n : 1;
        long *in = calloc((size_t)count * n + n, sizeof(long));
        long *out = calloc((size_t)count * n + n, sizeof(long));
        for (int i = 0; i < count; i++) in[i] = rank * 1000 + i;
        for (int op = 0; op < 5; op++) {
            double t0 = 0;
            for (int r = 0; r <= rounds; r++) {
                if (r == 1) { MPI_Barrier(merged); t0 = MPI_Wtime(); }
                switch (op) {
                case 0: MPI_Allreduce(in, out, count, MPI_LONG, MPI_SUM, merged); break;
                case 1: {
                    int root = high ? 0 : (local == 0 ? MPI_ROOT : MPI_PROC_NULL);
                    MPI_Reduce(in, out, count, MPI_LONG, MPI_SUM, root, inter);
                    break;
                }
                case 2: MPI_Allgather(in, count, MPI_LONG, out, count, MPI_LONG, merged); break;
                case 3: MPI_Reduce_scatter_block(in, out, block, MPI_LONG, MPI_SUM, merged); break;
                default: MPI_Barrier(merged);
                }
            }
            double us = (MPI_Wtime() - t0) * 1e6 / rounds, lo, hi, sum;
            /* The reduction's parent group has only its root taking part. */
            int part = op != 1 || high || local == 0;
            double mine_lo = part ? us : 1e300, mine_hi = part ? us : 0, mine_sum = part ? us : 0;
            int parts = 0;
            MPI_Reduce(&mine_lo, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, merged);
            MPI_Reduce(&mine_hi, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, merged);
            MPI_Reduce(&mine_sum, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, merged);
            MPI_Reduce(&part, &parts, 1, MPI_INT, MPI_SUM, 0, merged);
            if (rank == 0) printf("coll %s %d %.3f %.3f %.3f\n", names[op], bytes, lo, sum / parts, hi);
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    free(sizes);
    MPI_Comm_free(&merged);
}

static int child(MPI_Comm parent, int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "child-echo") == 0 && argc > 3) {
        echo(parent, 0, atoi(argv[2]), atoi(argv[3]) + 1);
    } else if (strcmp(mode, "child-wait") == 0) {
        int token;
        MPI_Recv(&token, 1, MPI_INT, 0, 0, parent, MPI_STATUS_IGNORE);
    } else if (strcmp(mode, "child-coll") == 0 && argc > 3) {
        collectives(parent, 1, argv[2], atoi(argv[3]));
    } else if (strcmp(mode, "child-merge") == 0) {
        MPI_Comm merged;
        MPI_Intercomm_merge(parent, 1, &merged);
        MPI_Barrier(merged);
        MPI_Comm_free(&merged);
    }
    MPI_Comm_disconnect(&parent);
    MPI_Finalize();
    return 0;
}

static MPI_Comm spawn_with(const char *self, char **args, int n, MPI_Comm comm) {
    MPI_Comm inter;
    MPI_Comm_spawn(self, args, n, MPI_INFO_NULL, 0, comm, &inter, MPI_ERRCODES_IGNORE);
    return inter;
}

static MPI_Comm spawn(const char *self, char *mode, int n, MPI_Comm comm) {
    char *args[] = {mode, NULL};
    MPI_Comm inter;
    MPI_Comm_spawn(self, args, n, MPI_INFO_NULL, 0, comm, &inter, MPI_ERRCODES_IGNORE);
    return inter;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) return child(parent, argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s latency N RUNS | rate N SECS | merge N | collectives N SIZES ROUNDS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int n = atoi(argv[2]);
    if (strcmp(argv[1], "latency") == 0 && argc > 3) {
        int runs = atoi(argv[3]);
        for (int r = 0; r < runs; r++) {
            double t0 = MPI_Wtime();
            MPI_Comm inter = spawn(argv[0], "child-exit", n, MPI_COMM_SELF);
            printf("latency_ms %.3f\n", (MPI_Wtime() - t0) * 1e3);
            fflush(stdout);
            MPI_Comm_disconnect(&inter);
        }
    } else if (strcmp(argv[1], "rate") == 0 && argc > 3) {
        double secs = atof(argv[3]);
        MPI_Comm kept[4096];
        int count = 0;
        double t0 = MPI_Wtime();
        while (MPI_Wtime() - t0 < secs && count < 4096) kept[count++] = spawn(argv[0], "child-wait", n, MPI_COMM_SELF);
        double elapsed = MPI_Wtime() - t0;
        printf("spawns %d\nseconds %.3f\nspawns_per_s %.2f\n", count, elapsed, count / elapsed);
        fflush(stdout);
        for (int i = 0; i < count; i++) {
            int size, token = 0;
            MPI_Comm_remote_size(kept[i], &size);
            for (int k = 0; k < size; k++) MPI_Send(&token, 1, MPI_INT, k, 0, kept[i]);
            MPI_Comm_disconnect(&kept[i]);
        }
    } else if (strcmp(argv[1], "merge") == 0) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm inter = spawn(argv[0], "child-merge", n, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Comm merged;
        MPI_Intercomm_merge(inter, 0, &merged);
        MPI_Barrier(merged);
        double ms = (MPI_Wtime() - t0) * 1e3;
        if (rank == 0) printf("merge_ms %.3f\n", ms);
        MPI_Comm_free(&merged);
        MPI_Comm_disconnect(&inter);
    } else if (strcmp(argv[1], "pingpong-inter") == 0 && argc > 3) {
        char *args[] = {"child-echo", argv[2], argv[3], NULL};
        MPI_Comm inter = spawn_with(argv[0], args, 1, MPI_COMM_SELF);
        ping(inter, 0, n, atoi(argv[3]));
        MPI_Comm_disconnect(&inter);
    } else if (strcmp(argv[1], "collectives") == 0 && argc > 4) {
        char *args[] = {"child-coll", argv[3], argv[4], NULL};
        MPI_Comm inter = spawn_with(argv[0], args, n, MPI_COMM_WORLD);
        collectives(inter, 0, argv[3], atoi(argv[4]));
        MPI_Comm_disconnect(&inter);
    } else if (strcmp(argv[1], "pingpong-intra") == 0 && argc > 3) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 0) ping(MPI_COMM_WORLD, 1, n, atoi(argv[3]));
        else if (rank == 1) echo(MPI_COMM_WORLD, 0, n, atoi(argv[3]) + 1);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Finalize();
    return 0;
}
