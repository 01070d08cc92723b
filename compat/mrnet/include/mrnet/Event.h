/* mrnet/Event.h: data, topology and error events, by callback or descriptor. */
#if !defined(__event_h)
#define __event_h 1

#include <list>
#include <map>
#include <string>

#include "mrnet/Types.h"

namespace MRN {

typedef int EventClass;
typedef int EventType;
class Stream;

class EventData {
 public:
    virtual ~EventData() {}
};

class Event {
 protected:
    EventClass _class;
    EventType _typ;
    EventData *_data;

 public:
    static const EventClass EVENT_CLASS_ALL;
    static const EventClass DATA_EVENT;
    static const EventClass TOPOLOGY_EVENT;
    static const EventClass ERROR_EVENT;
    static EventType EVENT_TYPE_ALL;

    Event(EventClass iclass, EventType ityp, EventData *idata) : _class(iclass), _typ(ityp), _data(idata) {}
    ~Event() { _data = NULL; }
    inline EventClass get_Class() const { return _class; }
    inline EventType get_Type() const { return _typ; }
    inline EventData *get_Data() const { return _data; }
};

class DataEvent : public Event {
 public:
    static EventType DATA_AVAILABLE;
    static EventType min_Type() { return DATA_AVAILABLE; }
    static EventType max_Type() { return DATA_AVAILABLE; }
    class DataEventData : public EventData {
     private:
        Stream *_strm;

     public:
        DataEventData(Stream *istrm) : _strm(istrm) {}
        Stream *get_Stream() { return _strm; }
    };
};

class ErrorEvent : public Event {
 public:
    static EventType ERROR_INTERNAL;
    static EventType ERROR_SYSTEM;
    static EventType ERROR_USAGE;
    static EventType min_Type() { return ERROR_INTERNAL; }
    static EventType max_Type() { return ERROR_USAGE; }
    class ErrorEventData : public EventData {
     private:
        Rank _rank;
        std::string _msg;

     public:
        ErrorEventData(Rank irank, const std::string &imsg) : _rank(irank), _msg(imsg) {}
        Rank get_Rank() const { return _rank; }
        std::string get_Message() const { return _msg; }
    };
};

class TopologyEvent : public Event {
 public:
    static EventType TOPOL_ADD_BE;
    static EventType TOPOL_ADD_CP;
    static EventType TOPOL_REMOVE_NODE;
    static EventType TOPOL_CHANGE_PARENT;
    static EventType min_Type() { return TOPOL_ADD_BE; }
    static EventType max_Type() { return TOPOL_CHANGE_PARENT; }
    class TopolEventData : public EventData {
     private:
        Rank _rank;
        Rank _parent_rank;

     public:
        TopolEventData(Rank irank, Rank iprank) : _rank(irank), _parent_rank(iprank) {}
        Rank get_Rank() const { return _rank; }
        Rank get_Parent_Rank() const { return _parent_rank; }
    };
};

typedef void (*evt_cb_func)(Event *, void *);

class evt_cb_info {
 public:
    evt_cb_func func;
    void *data;
    bool onetime;
    evt_cb_info(evt_cb_func ifunc, void *idata, bool once) : func(ifunc), data(idata), onetime(once) {}
};
typedef std::list<evt_cb_info> evt_cb_list;
typedef std::map<EventType, evt_cb_list> evt_typ_cb_map;

} /* namespace MRN */

#endif /* __event_h */
