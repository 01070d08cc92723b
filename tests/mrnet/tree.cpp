/* tree.cpp: MRNet's topology generators (mrnet/Tree.h) as an MRNet tool uses them:
 * host lists read from a buffer and a file, balanced, k-nomial and generic trees from
 * one host list and from separate back-end and internal lists, written as topology
 * files and compared with what they must hold; bad specifications and too few hosts
 * give no tree. Writes the balanced tree of "localhost" to argv[1], which the test
 * then runs a network on. Exits 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include "mrnet/MRNet.h"

using namespace MRN;

typedef std::list<std::pair<std::string, unsigned> > Hosts;

static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "tree: FAILED: %s\n", what);
        exit(1);
    }
}

/* What `tree` writes as a topology file. */
static std::string text_of(Tree &tree) {
    char path[] = "/tmp/mrnet-tree-XXXXXX";
    int fd = mkstemp(path);
    check(fd >= 0, "a temporary file");
    close(fd);
    check(tree.create_TopologyFile(path), "create_TopologyFile");
    FILE *f = fopen(path, "r");
    check(f != NULL, "reading the topology file back");
    std::string text;
    int c;
    while ((c = fgetc(f)) != EOF) text += (char)c;
    fclose(f);
    unlink(path);
    return text;
}

static void expect(Tree &tree, const char *want, const char *what) {
    std::string got = text_of(tree);
    if (got != want) {
        fprintf(stderr, "tree: FAILED: %s\n--- expected\n%s--- got\n%s", what, want, got.c_str());
        exit(1);
    }
}

/* A tree of type T over eight places on host "a" from `text`: none must be made. */
template <typename T>
static void refused(const char *text, const char *what) {
    std::string spec = text, fe = "fe";
    Hosts a;
    a.push_back(std::make_pair(std::string("a"), 8u));
    T tree(spec, fe, a, 8);
    check(!tree.is_Valid(), what);
}

int main(int argc, char **argv) {
    check(argc == 2, "usage: tree OUT_TOPOLOGY_FILE");
    std::string fe = "fe";

    Hosts hosts;
    Tree::get_HostsFromBuffer("nodeb:2 nodea\n  nodea:2\tnode.c.dotted:3 ", hosts);
    check(hosts.size() == 3, "get_HostsFromBuffer: three hosts");
    Hosts::iterator h = hosts.begin();
    check(h->first == "node.c.dotted" && h->second == 3, "hosts sorted by name, dotted names whole");
    ++h;
    check(h->first == "nodea" && h->second == 3, "a host named twice adds its counts");
    ++h;
    check(h->first == "nodeb" && h->second == 2, "host:count");

    char path[] = "/tmp/mrnet-hosts-XXXXXX";
    int fd = mkstemp(path);
    check(fd >= 0 && write(fd, "x:4\ny\n", 6) == 6, "writing a host file");
    close(fd);
    Hosts from_file;
    check(Tree::get_HostsFromFile(path, from_file) && from_file.size() == 2 && from_file.front().second == 4,
          "get_HostsFromFile");
    unlink(path);
    Hosts none;
    check(!Tree::get_HostsFromFile("/nonexistent/hosts", none), "get_HostsFromFile of a missing file fails");

    /* balanced, one list, at most 2 processes a host: internal nodes first */
    std::string spec = "2x2";
    BalancedTree two(spec, fe, hosts, 2);
    check(two.is_Valid(), "BalancedTree 2x2 is valid");
    expect(two,
           "fe:0 =>\n\tnode.c.dotted:0\n\tnode.c.dotted:1 ;\n\n"
           "node.c.dotted:0 =>\n\tnodea:0\n\tnodea:1 ;\n\n"
           "node.c.dotted:1 =>\n\tnodeb:0\n\tnodeb:1 ;\n\n",
           "BalancedTree 2x2 over one host list");

    spec = "3^2";
    BalancedTree big(spec, fe, hosts, 2);
    check(!big.is_Valid() && !big.create_TopologyFile("/tmp/never-written"), "too few hosts: no tree");
    refused<BalancedTree>("2y2", "a bad balanced specification: no tree");

    /* balanced, back-end and internal lists; the front-end's host starts at 1 */
    Hosts be, cp;
    be.push_back(std::make_pair(std::string("be"), 8u));
    cp.push_back(std::make_pair(std::string("fe"), 8u));
    spec = "2^2";
    BalancedTree split(spec, fe, be, cp, 4, 3);
    check(split.is_Valid(), "BalancedTree over two lists is valid");
    expect(split,
           "fe:0 =>\n\tfe:1\n\tfe:2 ;\n\n"
           "fe:1 =>\n\tbe:0\n\tbe:1 ;\n\n"
           "fe:2 =>\n\tbe:2\n\tbe:3 ;\n\n",
           "BalancedTree 2^2: internal places below the cap of 3 on the front-end's host (from 1), back-ends from "
           "their list");

    /* k-nomial: each round every node placed so far takes k-1 children */
    Hosts a;
    a.push_back(std::make_pair(std::string("a"), 8u));
    spec = "2@4";
    KnomialTree kn(spec, fe, a, 8);
    check(kn.is_Valid(), "KnomialTree 2@4 is valid");
    expect(kn, "fe:0 =>\n\ta:0\n\ta:1 ;\n\na:0 =>\n\ta:2 ;\n\n", "KnomialTree 2@4");
    spec = "3@9";
    KnomialTree kn2(spec, fe, be, cp, 8, 2);
    check(kn2.is_Valid(), "KnomialTree 3@9 over two lists is valid");
    expect(kn2,
           "fe:0 =>\n\tfe:1\n\tfe:2\n\tbe:0\n\tbe:1 ;\n\n"
           "fe:1 =>\n\tbe:2\n\tbe:3 ;\n\n"
           "fe:2 =>\n\tbe:4\n\tbe:5 ;\n\n",
           "KnomialTree 3@9: the last round's children from the back-end list");
    refused<KnomialTree>("1@4", "a k-nomial factor of 1: no tree");

    /* generic: levels by ':', each node's children by ',', NxC for N nodes of C */
    spec = "2:3,1";
    GenericTree gen(spec, fe, a, 8);
    check(gen.is_Valid(), "GenericTree 2:3,1 is valid");
    expect(gen, "fe:0 =>\n\ta:0\n\ta:1 ;\n\na:0 =>\n\ta:2\n\ta:3\n\ta:4 ;\n\na:1 =>\n\ta:5 ;\n\n",
           "GenericTree 2:3,1");
    spec = "2:2x2";
    GenericTree gen2(spec, fe, be, cp, 8, 2);
    check(gen2.is_Valid(), "GenericTree 2:2x2 over two lists is valid");
    expect(gen2, "fe:0 =>\n\tfe:1\n\tfe:2 ;\n\nfe:1 =>\n\tbe:0\n\tbe:1 ;\n\nfe:2 =>\n\tbe:2\n\tbe:3 ;\n\n",
           "GenericTree 2:2x2: back-ends from their own list");
    spec = "2:0,3";
    GenericTree gen0(spec, fe, a, 8);
    check(gen0.is_Valid(), "GenericTree 2:0,3 (a first child with no children) is valid");
    expect(gen0, "fe:0 =>\n\ta:0\n\ta:1 ;\n\na:1 =>\n\ta:2\n\ta:3\n\ta:4 ;\n\n", "GenericTree 2:0,3");
    refused<BalancedTree>("2^999999999", "a balanced tree too large to make: no tree, at once");
    refused<GenericTree>("1:999999999x1", "a generic tree too large to make: no tree, at once");
    refused<GenericTree>("2,1:3", "a generic first level of two specs: no tree");
    refused<GenericTree>("2:3,1,1", "children for more nodes than the level above has: no tree");
    refused<GenericTree>("2:3;1", "a character that is not part of a generic specification: no tree");
    refused<GenericTree>("2:3,", "a trailing separator: no tree");
    refused<KnomialTree>("2@", "a k-nomial tree with no node count: no tree");

    /* the tree the test runs a network on: 2 comm nodes over 4 back-ends, all local */
    Hosts local;
    local.push_back(std::make_pair(std::string("localhost"), 16u));
    std::string host = "localhost";
    spec = "2x2";
    BalancedTree run(spec, host, local, 16);
    check(run.is_Valid() && run.create_TopologyFile(argv[1]), "BalancedTree over localhost, written");
    printf("tree: ok\n");
    return 0;
}
