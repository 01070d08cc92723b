/* mrnet/NetworkTopology.h: the tree as the front-end sees it, and where a filter runs. */
#if !defined(NetworkTopology_h)
#define NetworkTopology_h 1

#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "mrnet/Error.h"
#include "mrnet/Types.h"

namespace MRN {

class Network;
class TopologyLocalInfo;

/* Nodes are numbered as treecast numbers them: the front-end 0, then every node in
 * pre-order; back-ends carry their back-end rank as get_Rank (docs/mrnet-compat.md). */
class NetworkTopology : public Error {
    friend class Network;
    friend class TopologyLocalInfo;

 public:
    class Node {
        friend class NetworkTopology;
        friend class Network;

     public:
        std::string get_HostName(void) const { return _hostname; }
        Port get_Port(void) const { return _port; }
        Rank get_Rank(void) const { return _rank; }
        Rank get_Parent(void) const { return _parent ? _parent->_rank : UnknownRank; }
        const std::set<Node *> &get_Children(void) const { return _children; }
        unsigned int get_NumChildren(void) const { return (unsigned int)_children.size(); }
        unsigned int find_SubTreeHeight(void);
        bool failed(void) const { return _failed; }
        bool is_BackEnd(void) const { return _is_backend; }

     private:
        Node(const std::string &host, Port port, Rank rank, bool is_backend)
            : _hostname(host), _port(port), _rank(rank), _is_backend(is_backend), _failed(false), _parent(NULL) {}
        std::string _hostname;
        Port _port;
        Rank _rank;
        bool _is_backend;
        bool _failed;
        Node *_parent;
        std::set<Node *> _children;
    };

    void print_TopologyFile(const char *filename) const;
    void print_DOTGraph(const char *filename) const;
    void print(FILE *) const;
    unsigned int get_NumNodes(void) const;
    void get_TreeStatistics(unsigned int &onum_nodes, unsigned int &odepth, unsigned int &omin_fanout,
                            unsigned &omax_fanout, double &oavg_fanout, double &ostddev_fanout);
    Node *get_Root(void) { return _root; }
    Node *find_Node(Rank) const;
    void get_Leaves(std::vector<Node *> &leaves) const;
    void get_ParentNodes(std::set<Node *> &) const;
    void get_OrphanNodes(std::set<Node *> &) const;
    void get_BackEndNodes(std::set<Node *> &) const;
    size_t num_BackEndNodes(void) const;
    size_t num_InternalNodes(void) const;
    void get_Descendants(Node *, std::vector<Node *> &odescendants) const;
    void get_LeafDescendants(Node *inode, std::vector<Node *> &odescendants) const;
    std::string get_TopologyString(void);
    ~NetworkTopology(void);

    /* The layer's own (front-end attach mode): takes the back-ends out of the tree
     * until they attach; puts one back under its parent (false if none is held);
     * sets the port of a held back-end's parent, where it attaches. */
    void hold_BackEnds(void);
    bool attach_BackEnd(Rank r);
    void set_ParentPort(Rank held, Port port);

 private:
    NetworkTopology();
    /* Reads `host:index => child:index ... ;` lines; back-ends are the leaves. */
    bool parse(const std::string &text, bool leaves_are_backends);
    void clear(void);
    unsigned int depth_of(Node *) const;
    /* Back-ends held until they attach. */
    std::map<Rank, Node *> _held;
    /* The tree grows while the tool reads it (attach mode): every query holds this. */
    mutable std::recursive_mutex _mu;
    Node *_root;
    std::vector<Node *> _nodes;
    std::string _text;
};

/* Where a filter instance runs: filled from treecast's plug-in place record. */
class TopologyLocalInfo {
 public:
    TopologyLocalInfo(Rank rank, unsigned int children, unsigned int depth, unsigned int leaves)
        : _rank(rank), _children(children), _depth(depth), _leaves(leaves) {}
    Rank get_Rank() const { return _rank; }
    unsigned int get_NumChildren() const { return _children; }
    unsigned int get_NumSiblings() const { return 0; }
    unsigned int get_NumDescendants() const { return _leaves; }
    unsigned int get_NumLeafDescendants() const { return _leaves; }
    unsigned int get_RootDistance() const { return _depth; }
    unsigned int get_MaxLeafDistance() const { return 0; }
    /* NULL: a filter at a comm node has no view of the whole tree. */
    const NetworkTopology *get_Topology() const { return NULL; }
    const Network *get_Network() const { return NULL; }

 private:
    Rank _rank;
    unsigned int _children, _depth, _leaves;
};

} /* namespace MRN */

#endif /* NetworkTopology_h */
