package node

import "github.com/corral-dev/corral/internal/events"

// SetLayerFault records that layer digest's data cannot be read (reason;
// "" clears it): every sandbox using the layer is reported degraded with
// the reason, new ones too, until the fault clears. Sandboxes keep
// running: only reads of data not yet on the node fail.
func (n *Node) SetLayerFault(digest, reason string) {
	n.faultMu.Lock()
	_, had := n.layerFaults[digest]
	if reason == "" {
		delete(n.layerFaults, digest)
	} else {
		n.layerFaults[digest] = reason
	}
	n.faultMu.Unlock()
	if reason == "" || had {
		return
	}
	for _, e := range n.entries() {
		rec := e.snapshot()
		for _, l := range rec.Layers {
			if l.Digest == digest {
				n.emit(rec, events.Degraded, "layer "+l.Ref+": "+reason, nil)
				break
			}
		}
	}
}

// degradedReason is why a sandbox on layers is degraded ("" when it is not).
func (n *Node) degradedReason(s *Sandbox) string {
	n.faultMu.Lock()
	defer n.faultMu.Unlock()
	for _, l := range s.Layers {
		if r, ok := n.layerFaults[l.Digest]; ok {
			return "layer " + l.Ref + ": " + r
		}
	}
	return ""
}
