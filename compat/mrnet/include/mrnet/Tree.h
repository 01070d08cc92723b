/* mrnet/Tree.h: MRNet's topology generators. Each builds a tree of "host:n" nodes from
 * a specification and a host list and writes it as an MRNet topology file
 * (create_TopologyFile), which Network::CreateNetworkFE reads.
 *
 *   BalancedTree  "FxGxH" (fan-out per level) or "F^D" (fan-out F, depth D)
 *   KnomialTree   "K@N": N nodes in a k-nomial tree of factor K
 *   GenericTree   "2:3,1" (levels by ':', each node's children by ','; "4x2" is four
 *                 nodes of two children)
 *
 * Hosts are (name, processes) pairs; a host gives at most that many processes, and at
 * most `procs_per_host`, numbered "host:0" on ("fe_host:0" is the front-end, so its
 * host's numbers start at 1). With one host list, internal nodes and back-ends take
 * its places in order; with two, back-ends come from the first and internal nodes
 * from the second. The files are those MRNet's generators write, with each node's
 * children in the order they were placed. */
#if !defined(__tree_h)
#define __tree_h 1

#include <cstdio>
#include <list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace MRN {

class BalancedTree;
class KnomialTree;
class GenericTree;

class Tree {
    friend class BalancedTree;
    friend class GenericTree;
    friend class KnomialTree;

    Tree(std::string &fe_host, std::string &topology_spec, unsigned int be_procs_per_host,
         unsigned int int_procs_per_host);

 public:
    /* One process of the tree, "host:n". */
    class Node {
        friend class Tree;

     private:
        std::string _name;
        std::vector<Node *> _children; /* in the order they were added */
        bool visited;

     public:
        Node(std::string n);
        void add_Child(Node *);
        /* Writes this node's line and its descendants' (nothing for a leaf). */
        void print_ToFile(FILE *);
        std::string name() { return _name; }
        /* Nodes reached from here, counting this one; 0 when a node is reached twice. */
        unsigned int visit();
    };

    /* The node of that name, made the first time it is asked for. */
    Node *get_Node(std::string);
    bool is_Valid() { return _valid; }

    bool create_TopologyFile(const char *ifilename);
    bool create_TopologyFile(FILE *ifile);

    /* Hosts from whitespace-separated "host" or "host:count" words (a host named again
     * adds to its count), sorted by name. */
    static bool get_HostsFromFile(const char *ifilename, std::list<std::pair<std::string, unsigned> > &hosts);
    static void get_HostsFromFileStream(FILE *ifile, std::list<std::pair<std::string, unsigned> > &hosts);
    static void get_HostsFromBuffer(const char *ibuf, std::list<std::pair<std::string, unsigned> > &hosts);

    virtual ~Tree();

 private:
    /* A tree owns its nodes: not copied. */
    Tree(const Tree &);
    Tree &operator=(const Tree &);

 protected:
    Node *root;
    std::map<std::string, Node *> NodesByName;
    std::string _fe_host, _topology_spec;
    bool _contains_cycle, _contains_unreachable_nodes, _valid;
    unsigned int _num_leaves, _depth;
    unsigned int _be_procs_per_host, _int_procs_per_host;

    bool validate();
    bool contains_Cycle() { return _contains_cycle; }
    bool contains_UnreachableNodes() { return _contains_unreachable_nodes; }
};

class BalancedTree : public Tree {
 private:
    bool parse_Spec();
    std::vector<unsigned int> _fanouts;

 public:
    BalancedTree(std::string &topology_spec, std::string &fe_host,
                 std::list<std::pair<std::string, unsigned> > &hosts, unsigned int max_procs_per_host = 1);

    BalancedTree(std::string &topology_spec, std::string &fe_host,
                 std::list<std::pair<std::string, unsigned> > &backend_hosts,
                 std::list<std::pair<std::string, unsigned> > &internal_hosts, unsigned int be_procs_per_host = 1,
                 unsigned int int_procs_per_host = 1);
};

class KnomialTree : public Tree {
 private:
    bool parse_Spec();
    unsigned int _kfactor;
    unsigned int _num_nodes;

 public:
    KnomialTree(std::string &topology_spec, std::string &fe_host,
                std::list<std::pair<std::string, unsigned> > &hosts, unsigned int max_procs_per_host = 1);

    KnomialTree(std::string &topology_spec, std::string &fe_host,
                std::list<std::pair<std::string, unsigned> > &backend_hosts,
                std::list<std::pair<std::string, unsigned> > &internal_hosts, unsigned int be_procs_per_host = 1,
                unsigned int int_procs_per_host = 1);
};

class GenericTree : public Tree {
 private:
    bool parse_Spec();
    /* per level, the number of children of each node of the level above */
    std::vector<std::vector<unsigned int> > _children_by_level;

 public:
    GenericTree(std::string &topology_spec, std::string &fe_host,
                std::list<std::pair<std::string, unsigned> > &hosts, unsigned int max_procs_per_host = 1);

    GenericTree(std::string &topology_spec, std::string &fe_host,
                std::list<std::pair<std::string, unsigned> > &backend_hosts,
                std::list<std::pair<std::string, unsigned> > &internal_hosts, unsigned int be_procs_per_host = 1,
                unsigned int int_procs_per_host = 1);

    ~GenericTree();
};

} /* namespace MRN */

#endif /* __tree_h */
