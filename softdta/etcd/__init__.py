"""A client of etcd's v3 API (through its JSON gateway): keys, leases, transactions and watches."""
