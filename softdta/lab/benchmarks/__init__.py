"""`softdta bench`: softdta against the alternatives a user would pick, measured side by side in one run.

Every comparison runs its contenders in the same process, one after the other, on the same reports, so the
ratios hold even though absolute times on a shared machine drift. Each timing is the median of several rounds,
kept with its min and max. See docs/benchmarks.md.

One module per thing measured: `translator` (the XDP program, the reference translator, a userspace UDP
translator), `python_engine` (the python engine live, the batch translator), `live` (the XDP translator live in
the lab and on the direct path), `collector` (the XDP responder against userspace collectors), `queries`
(Key-Write query rate and success), `fleet` (the slot map's balance and moves on a join), `router` (the
fleet's query router against one collector), `export` (Append entries exported to NATS JetStream, and the XDP
responder beside the exporter); `workloads` holds what they share and `comparison` runs them all.
"""
