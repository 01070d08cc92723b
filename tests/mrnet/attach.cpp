/* attach.cpp: back-ends started by someone else, with MRNet's arguments (parent host,
 * parent port, parent rank, own host, own rank), join a tree through its attach file
 * (TREECAST_ATTACH): the secret never is on their command line. The front-end here is
 * treecast's C API in attach mode (tests/mrnet/attach_fe.cpp is the MRNet front-end's own);
 * the back-ends are tests/mrnet/be.cpp. Usage: attach BACKEND COMMNODE DIR; prints
 * "mrnet-attach: ok". */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "protocol.h"
#include "treecast.h"

static void check(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "attach: FAILED: %s: %s\n", what, tc_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BACKEND COMMNODE DIR\n", argv[0]);
        return 2;
    }
    const std::string be = argv[1], file = std::string(argv[3]) + "/attach-file";
    const int n = 4;
    tc_network_options *o = tc_network_options_new();
    check(tc_network_options_set_topology(o, "balanced:2x2", 0) == TC_OK, "topology");
    check(tc_network_options_set_attach(o, file.c_str(), 60000) == TC_OK, "attach mode");
    check(tc_network_options_set_treecast_path(o, argv[2]) == TC_OK, "the comm node program");
    std::vector<pid_t> pids;
    /* Start the back-ends once the attach file is there, as a job launcher would. */
    std::thread starter([&]() {
        struct stat st;
        for (int i = 0; i < 600 && stat(file.c_str(), &st) != 0; i++) usleep(100000);
        for (int r = 0; r < n; r++) {
            pid_t pid = fork();
            if (pid == 0) {
                setenv("TREECAST_ATTACH", file.c_str(), 1);
                unsetenv("TREECAST_PARENT");
                std::string rank = std::to_string(r);
                execl(be.c_str(), be.c_str(), "parent.host.example", "0", "1000000", "localhost", rank.c_str(),
                      (char *)NULL);
                _exit(127);
            }
            pids.push_back(pid);
        }
    });
    tc_network *net = NULL;
    tc_result launched = tc_network_launch(o, &net);
    starter.join();
    tc_network_options_free(o);
    check(launched == TC_OK, "launch in attach mode with back-ends given MRNet's arguments");
    check(tc_network_backends(net) == (uint32_t)n, "every back-end attached");
    tc_communicator *all = NULL;
    check(tc_network_broadcast_communicator(net, &all) == TC_OK, "broadcast communicator");
    tc_stream *sum = NULL;
    check(tc_stream_new(net, all, "sum", NULL, TC_SYNC_WAIT_FOR_ALL, 0, &sum) == TC_OK, "sum stream");
    check(tc_stream_send(sum, TAG_VALUE, "%d", 1) == TC_OK, "send");
    tc_packet *p = NULL;
    check(tc_stream_recv(sum, 60000, &p) == TC_OK, "receive");
    int32_t v = 0;
    check(tc_packet_unpack(p, "%d", &v) == TC_OK && v == 1 + 2 + 3 + 4, "each attached back-end's own rank");
    tc_packet_free(p);
    check(tc_stream_send(sum, TAG_EXIT, "") == TC_OK, "send the exit");
    check(tc_stream_recv(sum, 60000, &p) == TC_OK, "the exit's answer");
    tc_packet_free(p);
    tc_stream_free(sum);
    tc_communicator_free(all);
    tc_network_free(net);
    bool clean = true;
    for (size_t i = 0; i < pids.size(); i++) {
        int status = 0;
        for (int t = 0; t < 300 && waitpid(pids[i], &status, WNOHANG) == 0; t++) usleep(100000);
        if (waitpid(pids[i], &status, WNOHANG) == 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &status, 0);
            clean = false;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            clean = false;
        }
    }
    check(clean, "every back-end ended by itself with status 0");
    printf("mrnet-attach: ok\n");
    return 0;
}
