"""The fleet's processes over etcd: the controller that commits slot maps, the federated query router."""
