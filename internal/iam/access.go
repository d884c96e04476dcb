package iam

import (
	"fmt"
	"strings"
)

// Within reports whether project is scope itself or lies beneath it.
// The root scope "" contains every project.
func Within(project, scope string) bool {
	return scope == "" || project == scope || strings.HasPrefix(project, scope+"/")
}

// Sees reports whether p may see what belongs to project: the node
// administrator sees everything, a token its own project and the projects
// beneath it (never its parent's).
func (p Principal) Sees(project string) bool {
	if p.NodeAdmin {
		return true
	}
	return p.Project != "" && Within(project, p.Project)
}

// Administers reports whether p may manage project (tokens, subprojects,
// quotas of its children).
func (p Principal) Administers(project string) bool {
	return p.NodeAdmin || (p.Role == RoleAdmin && p.Sees(project))
}

// CanWrite reports whether p may create and change things (every role but
// viewer).
func (p Principal) CanWrite() bool {
	return p.NodeAdmin || p.Role == RoleAdmin || p.Role == RoleMember
}

// String names p in errors and audit entries; never a secret.
func (p Principal) String() string {
	if p.NodeAdmin {
		return "node-admin"
	}
	return fmt.Sprintf("token %s (project %s, %s)", p.TokenID, p.Project, p.Role)
}

// Ancestors returns project and every project above it, the project itself
// first: "a/b/c" → [a/b/c a/b a].
func Ancestors(project string) []string {
	if project == "" {
		return nil
	}
	var out []string
	for p := project; ; {
		out = append(out, p)
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return out
		}
		p = p[:i]
	}
}

// parentOf returns the project above path ("" for a top-level project).
func parentOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i]
	}
	return ""
}
