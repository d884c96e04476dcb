package node

// Defaults are the values a create that names none gets (after fallbacks);
// a cluster node's admission estimates such creates with them.
func (n *Node) Defaults() Defaults { return n.cfg.Defaults }
