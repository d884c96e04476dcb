package cli

import (
	"fmt"
	"strconv"
	"strings"
)

// parseBytes accepts 123, 64Ki, 512Mi, 2Gi, 1Ti and the decimal K, M, G, T.
func parseBytes(flag, s string) (int64, error) {
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--%s: %w", flag, err)
	}
	return n, nil
}

// parseSize is parseBytes with an error that names no flag.
func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1},
	}
	mult := int64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (examples: 512Mi, 2Gi, 1000000)", s)
	}
	return int64(v * float64(mult)), nil
}

// parseCPU accepts millicores ("500m") or cores ("2", "1.5").
func parseCPU(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if m, ok := strings.CutSuffix(s, "m"); ok {
		v, err := strconv.ParseInt(m, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("--cpu: %q is not a number of millicores (example: 500m)", s)
		}
		return v, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("--cpu: %q is not a number of cores (examples: 1, 0.5, 250m)", s)
	}
	return int64(v * 1000), nil
}

// parseKV turns KEY=VALUE flags into a map.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s: %q is not KEY=VALUE", flag, kv)
		}
		out[k] = v
	}
	return out, nil
}

// formatBytes prints a size with a binary unit: 512B, 4.0KiB, 1.5GiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
