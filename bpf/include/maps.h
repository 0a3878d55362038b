/* Map declarations. A table's key and value layouts are the generated ones of softdta_spec.h: the maps are the
 * contract with the control plane (spec.TRANSLATOR_TABLES, spec.RESPONDER_TABLES). */
#ifndef SOFTDTA_MAPS_H
#define SOFTDTA_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define TABLE(_name, _type, _key, _value, _max)                                                          \
	struct {                                                                                         \
		__uint(type, _type);                                                                     \
		__type(key, _key);                                                                       \
		__type(value, _value);                                                                   \
		__uint(max_entries, _max);                                                               \
	} _name SEC(".maps")

/* A ring buffer of `_bytes` bytes (a power of two) whose records userspace decodes by the spec's RECORDS. */
#define RING(_name, _bytes)                                                                              \
	struct {                                                                                         \
		__uint(type, BPF_MAP_TYPE_RINGBUF);                                                      \
		__uint(max_entries, _bytes);                                                             \
	} _name SEC(".maps")

/* A FIFO of `_value` records, without a key. */
#define QUEUE(_name, _value, _max)                                                                       \
	struct {                                                                                         \
		__uint(type, BPF_MAP_TYPE_QUEUE);                                                        \
		__type(value, _value);                                                                   \
		__uint(max_entries, _max);                                                               \
	} _name SEC(".maps")

#endif /* SOFTDTA_MAPS_H */
