package netpolicy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Config configures a node's sandbox networking.
type Config struct {
	// Bridge is the node bridge's name (default "corral0").
	Bridge string
	// Subnet4 and Subnet6 hold the sandboxes' addresses; the first host
	// address of each is the gateway (and DNS proxy). Defaults
	// 100.96.0.0/16 and fd63:6f72:7261:6c00::/64. Both lie in ranges every
	// sandbox is denied, so sandboxes never reach each other.
	Subnet4, Subnet6 netip.Prefix
	// NodeNetns is the network namespace (a /proc/.../ns/net or
	// /run/netns path) that plays the node's side: bridge, NAT, DNS proxy.
	// Empty: the daemon's own. Tests use a namespace of their own so that
	// the host's forwarding settings stay untouched.
	NodeNetns string
	// Upstreams are the DNS servers ("ip:port") the proxy asks. Default:
	// the nameservers of /etc/resolv.conf.
	Upstreams []string
	// Presets are named rule lists (default DefaultPresets()).
	Presets map[string][]string
	// PoolSize is how many sandbox namespaces are kept ready (default 4);
	// the pool's filler holds one more while it waits for room.
	PoolSize int
	// DNS bounds what one sandbox may make the DNS proxy do.
	DNS DNSLimits
	// ConntrackPerSandbox caps the host conntrack entries one sandbox
	// address may hold (default 4096); new flows beyond it are dropped and
	// counted (hook "limit", name "conntrack").
	ConntrackPerSandbox int
	Logger              *slog.Logger
}

// Manager is a node's sandbox networking. Nothing on the host changes until
// the first networked sandbox needs it.
type Manager struct {
	cfg Config
	log *slog.Logger

	startMu sync.Mutex
	started bool
	filling bool // the pool's filler runs (from the first Attach on)
	ns      *os.File
	node    *nodeSide
	dns     *dnsProxy
	deny    []netip.Prefix // always denied, node addresses included
	pool    chan *slot
	stop    chan struct{}
	wg      sync.WaitGroup

	mu        sync.Mutex
	used      map[uint32]bool
	bySrc     map[netip.Addr]*Sandbox
	sandboxes map[string]*Sandbox
}

// NewManager checks the config; the node side is set up on first use.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = "corral0"
	}
	if len(cfg.Bridge) > 15 {
		return nil, errdefs.InvalidArgument("network: bridge name %q is longer than 15 characters", cfg.Bridge)
	}
	if !cfg.Subnet4.IsValid() {
		cfg.Subnet4 = netip.MustParsePrefix("100.96.0.0/16")
	}
	if !cfg.Subnet6.IsValid() {
		cfg.Subnet6 = netip.MustParsePrefix("fd63:6f72:7261:6c00::/64")
	}
	if !cfg.Subnet4.Addr().Is4() || cfg.Subnet4.Bits() > 28 || cfg.Subnet4 != cfg.Subnet4.Masked() {
		return nil, errdefs.InvalidArgument("network: subnet4 %s must be an IPv4 prefix of at most /28", cfg.Subnet4)
	}
	if !cfg.Subnet6.Addr().Is6() || cfg.Subnet6.Bits() > 120 || cfg.Subnet6 != cfg.Subnet6.Masked() {
		return nil, errdefs.InvalidArgument("network: subnet6 %s must be an IPv6 prefix of at most /120", cfg.Subnet6)
	}
	if cfg.Presets == nil {
		cfg.Presets = DefaultPresets()
	}
	for name, rules := range cfg.Presets {
		if _, err := Validate(Policy{Mode: ModeAllowlist, Allow: rules}, nil); err != nil {
			return nil, fmt.Errorf("network: preset %s: %w", name, err)
		}
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = 4
	}
	if cfg.ConntrackPerSandbox <= 0 {
		cfg.ConntrackPerSandbox = defaultConntrackPerSandbox
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager{cfg: cfg, log: cfg.Logger.With("component", "netpolicy"),
		used: map[uint32]bool{}, bySrc: map[netip.Addr]*Sandbox{}, sandboxes: map[string]*Sandbox{}}, nil
}

// Presets returns the node's presets.
func (m *Manager) Presets() map[string][]string { return m.cfg.Presets }

func (m *Manager) gateways() (netip.Prefix, netip.Prefix) {
	return netip.PrefixFrom(m.cfg.Subnet4.Addr().Next(), m.cfg.Subnet4.Bits()),
		netip.PrefixFrom(m.cfg.Subnet6.Addr().Next(), m.cfg.Subnet6.Bits())
}

// ensure sets up the node side, the DNS proxy and the pool, once.
func (m *Manager) ensure() error {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	if m.started {
		return nil
	}
	if err := m.openNode(); err != nil {
		return err
	}
	if err := m.node.setUp(); err != nil {
		return fmt.Errorf("network: node side: %w", err)
	}
	addrs, err := m.node.addresses()
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	m.deny = slices.Clone(alwaysDenied)
	m.deny = append(m.deny, addrs...)
	for i := range m.deny {
		m.deny[i] = to16(m.deny[i])
	}
	ups := m.cfg.Upstreams
	if len(ups) == 0 {
		ups = resolvConfServers("/etc/resolv.conf")
	}
	m.dns = &dnsProxy{m: m, ns: m.ns, upstreams: ups, lim: newLimiter(m.cfg.DNS, m.log), log: m.log}
	gw4, gw6 := m.gateways()
	if err := m.dns.start([]netip.Addr{gw4.Addr(), gw6.Addr()}); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	m.pool = make(chan *slot, m.cfg.PoolSize)
	m.stop = make(chan struct{})
	m.wg.Add(1)
	go m.expire()
	m.started = true
	m.log.Info("sandbox networking ready", "bridge", m.cfg.Bridge, "gateway4", gw4, "gateway6", gw6, "upstreams", ups)
	return nil
}

// openNode opens the node namespace and a netlink handle in it.
func (m *Manager) openNode() error {
	if m.node != nil {
		return nil
	}
	if m.cfg.NodeNetns != "" {
		f, err := os.Open(m.cfg.NodeNetns)
		if err != nil {
			return fmt.Errorf("network: node netns: %w", err)
		}
		m.ns = f
	}
	nl, err := handleIn(m.ns)
	if err != nil {
		return fmt.Errorf("network: netlink: %w", err)
	}
	gw4, gw6 := m.gateways()
	m.node = &nodeSide{ns: m.ns, nl: nl, bridge: m.cfg.Bridge, gw4: gw4, gw6: gw6, ctLimit: m.cfg.ConntrackPerSandbox, dns: m.cfg.DNS.withDefaults()}
	return nil
}

// resolvConfServers reads the nameserver lines of a resolv.conf.
func resolvConfServers(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

// fill keeps the pool full.
func (m *Manager) fill() {
	defer m.wg.Done()
	for {
		s, err := m.newSlot()
		if err != nil {
			m.log.Warn("network pool: make namespace", "err", err)
			select {
			case <-m.stop:
				return
			case <-time.After(time.Second):
				continue
			}
		}
		select {
		case m.pool <- s:
		case <-m.stop:
			m.freeSlot(s)
			return
		}
	}
}

// expire drops DNS-learned addresses whose TTL has run out.
func (m *Manager) expire() {
	defer m.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastSummary := time.Now()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.mu.Lock()
			sbs := make([]*Sandbox, 0, len(m.sandboxes))
			for _, s := range m.sandboxes {
				sbs = append(sbs, s)
			}
			m.mu.Unlock()
			for _, s := range sbs {
				if err := s.expire(now); err != nil {
					m.log.Warn("network: expire DNS answers", "sandbox", s.id, "err", err)
				}
			}
			if now.Sub(lastSummary) >= summaryInterval {
				m.dns.lim.summarize(sbs)
				lastSummary = now
			}
		}
	}
}

// vethName is unique per bridge and index, and at most 15 characters.
func (m *Manager) vethName(index uint32) string {
	h := fnv.New32a()
	h.Write([]byte(m.cfg.Bridge))
	return fmt.Sprintf("cr%06x-%x", h.Sum32()&0xffffff, index)
}

func (m *Manager) newSlot() (*slot, error) {
	m.mu.Lock()
	hostBits := 32 - m.cfg.Subnet4.Bits()
	limit := uint32(1)<<hostBits - 2 // no broadcast
	var index uint32
	for i := uint32(2); i < limit; i++ {
		if !m.used[i] {
			index = i
			break
		}
	}
	if index == 0 {
		m.mu.Unlock()
		return nil, errdefs.ResourceExhausted("network: no free address in %s", m.cfg.Subnet4)
	}
	m.used[index] = true
	m.mu.Unlock()
	s, err := m.node.makeSlot(index, addAddr(m.cfg.Subnet4.Addr(), index), addAddr(m.cfg.Subnet6.Addr(), index), m.vethName(index))
	if err != nil {
		m.mu.Lock()
		delete(m.used, index)
		m.mu.Unlock()
		return nil, err
	}
	return s, nil
}

func (m *Manager) freeSlot(s *slot) {
	if err := s.destroy(m.node); err != nil {
		m.log.Warn("network: remove namespace", "veth", s.hostVeth, "err", err)
	}
	m.mu.Lock()
	delete(m.used, s.index)
	m.mu.Unlock()
}

// addAddr returns base + n (n small enough for the prefix).
func addAddr(base netip.Addr, n uint32) netip.Addr {
	b := base.AsSlice()
	carry := uint64(n)
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		v := uint64(b[i]) + carry
		b[i] = byte(v)
		carry = v >> 8
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// take returns a ready slot: from the pool, or made now if it is empty.
// The first call starts the pool's filler: not earlier, so that sandboxes
// recovered after a restart hold their indexes (and veth names) before
// the pool picks any.
func (m *Manager) take(ctx context.Context) (*slot, error) {
	m.startMu.Lock()
	if m.started && !m.filling {
		m.filling = true
		m.wg.Add(1)
		go m.fill()
	}
	m.startMu.Unlock()
	select {
	case s, ok := <-m.pool:
		if ok {
			return s, nil
		}
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m.newSlot()
}

// Record is what the backend persists to find a sandbox's network again.
type Record struct {
	Index    uint32   `json:"index"`
	Addr4    string   `json:"addr4"`
	Addr6    string   `json:"addr6"`
	HostVeth string   `json:"host_veth"`
	Mode     Mode     `json:"mode"`
	Allow    []string `json:"allow,omitempty"`
	VM       bool     `json:"vm,omitempty"` // enforced on the veth (AttachVM)
}

// Attach gives sandbox id a namespace from the pool and attaches the
// programs, with p's rules in place, to its cgroup v2 directory. The
// sandbox's init must be started inside Sandbox.Netns. On error nothing
// remains.
func (m *Manager) Attach(ctx context.Context, id, cgroupDir string, p Policy) (*Sandbox, error) {
	if cgroupDir == "" {
		return nil, errdefs.NotSupported("network: no cgroup v2 directory for the eBPF programs (needs a cgroup2 mount)")
	}
	sb, s, err := m.attach(ctx, id, p, false)
	if err != nil {
		return nil, err
	}
	// The rules go in before the programs: from the first packet on, the
	// sandbox meets its policy, never an empty (all-denying) map or none.
	if err := sb.sync(); err != nil {
		m.freeSlot(s)
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := s.filter.attach(cgroupDir); err != nil {
		m.freeSlot(s)
		return nil, fmt.Errorf("network: %w", err)
	}
	m.register(sb)
	return sb, nil
}

// attach is the part Attach and AttachVM share: the policy checked and its
// presets expanded, the node side ready, and a pooled namespace taken for
// sandbox id (the caller frees the slot if it fails later).
func (m *Manager) attach(ctx context.Context, id string, p Policy, vm bool) (*Sandbox, *slot, error) {
	rules, err := Validate(p, m.cfg.Presets)
	if err != nil {
		return nil, nil, err
	}
	if p.Mode == ModeNone {
		return nil, nil, errdefs.InvalidArgument("network.mode: none needs no network (the sandbox keeps its own loopback namespace)")
	}
	if err := m.ensure(); err != nil {
		return nil, nil, err
	}
	s, err := m.take(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("network: %w", err)
	}
	sb := &Sandbox{m: m, id: id, index: s.index, addr4: s.addr4, addr6: s.addr6, hostVeth: s.hostVeth,
		ns: s.ns, filter: s.filter, mode: p.Mode, allow: slices.Clone(p.Allow), rules: rules,
		learned: map[netip.Addr]learned{}, refusedNames: map[string]uint64{}, vm: vm}
	return sb, s, nil
}

func (m *Manager) register(sb *Sandbox) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used[sb.index] = true
	m.bySrc[sb.addr4] = sb
	m.bySrc[sb.addr6] = sb
	m.sandboxes[sb.id] = sb
}

// Recover finds the network of a sandbox that outlived a daemon restart
// (its programs and maps are still attached to its cgroup, or for a
// microVM to its veth; cgroupDir is then unused).
func (m *Manager) Recover(ctx context.Context, id, cgroupDir string, rec Record) (*Sandbox, error) {
	a4, err4 := netip.ParseAddr(rec.Addr4)
	a6, err6 := netip.ParseAddr(rec.Addr6)
	if err := errors.Join(err4, err6); err != nil {
		return nil, fmt.Errorf("network: record of %s: %w", id, err)
	}
	m.mu.Lock()
	if m.used[rec.Index] {
		m.mu.Unlock()
		return nil, fmt.Errorf("network: record of %s: address index %d is in use", id, rec.Index)
	}
	// Held from now on: the pool never picks this sandbox's index.
	m.used[rec.Index] = true
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		delete(m.used, rec.Index)
		m.mu.Unlock()
	}
	if err := m.ensure(); err != nil {
		release()
		return nil, err
	}
	var f *filter
	var err error
	if rec.VM {
		f, err = recoverTapFilter(m.node, rec.HostVeth)
	} else {
		f, err = recoverFilter(cgroupDir)
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("network: %w", err)
	}
	rules, err := Validate(Policy{Mode: rec.Mode, Allow: rec.Allow}, m.cfg.Presets)
	if err != nil {
		f.maps.close()
		release()
		return nil, fmt.Errorf("network: record of %s: %w", id, err)
	}
	sb := &Sandbox{m: m, id: id, index: rec.Index, addr4: a4, addr6: a6, hostVeth: rec.HostVeth, filter: f,
		vm: rec.VM, mode: rec.Mode, allow: rec.Allow, rules: rules, learned: map[netip.Addr]learned{}, refusedNames: map[string]uint64{}}
	m.register(sb)
	return sb, nil
}

// Remove deletes what the network of a dead sandbox left without a live
// Sandbox (its host veth); the namespace went with its processes.
func (m *Manager) Remove(rec Record) error {
	if rec.HostVeth == "" {
		return nil
	}
	m.mu.Lock()
	// The index (and so the veth's name) may already belong to a pooled
	// namespace or a new sandbox: theirs is not this record's to remove.
	reused := m.used[rec.Index]
	m.mu.Unlock()
	if reused {
		return nil
	}
	if err := m.openNode(); err != nil {
		return err
	}
	return m.node.deleteLink(rec.HostVeth)
}

// Sweep removes bridge ports that keep does not claim (a crash between
// create steps, or a sandbox whose record is gone).
func (m *Manager) Sweep(keep func(hostVeth string) bool) error {
	if err := m.openNode(); err != nil {
		return err
	}
	br, err := m.node.nl.LinkByName(m.cfg.Bridge)
	if err != nil {
		return nil // never set up
	}
	m.node.brIndex = br.Attrs().Index
	ports, err := m.node.ports()
	if err != nil {
		return err
	}
	m.mu.Lock()
	// Sandboxes and the pool's slots hold indexes; their veths stay.
	live := map[string]bool{}
	for i := range m.used {
		live[m.vethName(i)] = true
	}
	m.mu.Unlock()
	var errs []error
	for _, p := range ports {
		if !live[p] && !keep(p) && strings.HasPrefix(p, "cr") {
			m.log.Info("sweeping leftover sandbox veth", "veth", p)
			errs = append(errs, m.node.deleteLink(p))
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) bySource(a netip.Addr) *Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bySrc[a]
}

// Close stops the pool and the DNS proxy. With no sandbox left it also
// removes the bridge and the NAT table.
func (m *Manager) Close() error {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	if !m.started {
		if m.node != nil {
			m.node.nl.Close()
		}
		if m.ns != nil {
			m.ns.Close()
		}
		m.node, m.ns = nil, nil
		return nil
	}
	close(m.stop)
	m.wg.Wait()
	close(m.pool)
	for s := range m.pool {
		m.freeSlot(s)
	}
	m.dns.stop()
	m.started, m.filling = false, false
	m.mu.Lock()
	empty := len(m.sandboxes) == 0
	m.mu.Unlock()
	if !empty {
		// Sandboxes outlive the manager (a daemon stop without cleanup):
		// the bridge and NAT stay for them, and so does the handle a late
		// Sandbox.Close needs.
		return nil
	}
	err := m.node.tearDown()
	m.node.nl.Close()
	if m.ns != nil {
		m.ns.Close()
	}
	m.node, m.ns = nil, nil
	return err
}
