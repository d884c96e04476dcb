package seccomp

import "maps"

// rwfNowait is RWF_NOWAIT, a flag of preadv2/pwritev2 (argument 5): fail
// with EAGAIN instead of waiting for I/O, which tells whether a file's
// pages are cached.
const rwfNowait = 0x8

// WithoutPageCacheProbes returns a copy of p that refuses the calls that
// report whether a file's pages are in the page cache: on the read-only
// layers every sandbox of a node shares, they tell whether a neighbour read
// a file recently. It is the node's opt-in stronger setting (corral serve
// --refuse-page-cache-probes): it closes these exact probes, not the
// timing of an ordinary read, and fails the few programs that use them.
func (p *Profile) WithoutPageCacheProbes() *Profile {
	q := &Profile{rules: maps.Clone(p.rules)}
	const origin = "corral (page-cache probes refused)"
	q.rules["mincore"] = rule{def: actEPERM, origin: origin,
		why: "page residency of a mapping: on a shared layer file, whether a neighbour read it"}
	q.rules["cachestat"] = rule{def: actENOSYS, origin: origin,
		why: "page-cache statistics of any open file, as mincore; ENOSYS: callers treat it as a kernel without it"}
	for _, name := range []string{"preadv2", "pwritev2"} {
		r := q.rules[name]
		r.origin = origin
		r.checks = append([]check{{when: []cond{masked(5, rwfNowait, rwfNowait)}, then: actEPERM,
			why: "RWF_NOWAIT: EAGAIN when the pages are not cached, the same probe"}}, r.checks...)
		q.rules[name] = r
	}
	return q
}
