package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
)

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// fileUser returns the user a /files request acts as: the username query
// parameter, else the Basic authorization user ("" = default).
func fileUser(r *http.Request) (string, error) {
	if u := r.URL.Query().Get("username"); u != "" {
		return u, nil
	}
	return userOf(r.Header)
}

// checkSignature verifies a signed /files URL (when the request carries no
// access token): v1_ + base64(sha256("path:operation:user:token[:expiry]")).
func (s *Server) checkSignature(r *http.Request, id, operation string) error {
	if r.Header.Get("X-Access-Token") != "" {
		return nil // checked by ServeHTTP
	}
	q := r.URL.Query()
	raw := q.Get("path") + ":" + operation + ":" + q.Get("username") + ":" + s.accessToken(id)
	if exp := q.Get("signature_expiration"); exp != "" {
		t, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return errdefs.InvalidArgument("signature_expiration: %q is not a unix time", exp)
		}
		if time.Now().Unix() > t {
			return errdefs.PermissionDenied("signature expired at %s", time.Unix(t, 0).UTC().Format(time.RFC3339))
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return errdefs.PermissionDenied("signature does not match path %q and operation %s", q.Get("path"), operation)
	}
	return nil
}

// signed serves /files requests whose signature allows operation (read
// or write) with h, given the sandbox's id.
func (s *Server) signed(operation string, h func(w http.ResponseWriter, r *http.Request, id string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := sandboxFrom(r.Context())
		if err := s.checkSignature(r, id, operation); err != nil {
			writeErr(w, err)
			return
		}
		h(w, r, id)
	}
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	p, err := s.resolve(ctx, id, r.URL.Query().Get("path"))
	if err != nil {
		writeErr(w, err)
		return
	}
	fi, err := s.cfg.Node.Stat(ctx, id, p)
	if err == nil && fi.Mode.IsDir() {
		err = errdefs.InvalidArgument("path %q: is a directory", p)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	rc, err := s.cfg.Node.ReadFile(ctx, id, p, 0, 0)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		if _, err := io.Copy(gz, rc); err == nil {
			_ = gz.Close()
		}
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	_, _ = io.Copy(w, rc)
}

// writeInfo is one written file in a /files upload answer.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func (s *Server) postFiles(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	user, err := fileUser(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "gzip body: "+err.Error())
			return
		}
		defer gz.Close()
		body = gz
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	if mt == "multipart/form-data" {
		out, err = s.writeParts(ctx, id, r.URL.Query().Get("path"), user, multipart.NewReader(body, params["boundary"]))
	} else {
		var wi writeInfo
		wi, err = s.writeOne(ctx, id, r.URL.Query().Get("path"), user, body)
		out = []writeInfo{wi}
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeParts writes every file part of a multipart upload: to the path
// query when given (one file), else to the part's file name.
func (s *Server) writeParts(ctx context.Context, id, target, user string, mr *multipart.Reader) ([]writeInfo, error) {
	var out []writeInfo
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, errdefs.InvalidArgument("multipart body: %v", err)
		}
		if len(out) == maxUploadParts {
			return nil, errdefs.InvalidArgument("multipart body: more than %d files", maxUploadParts)
		}
		p := target
		if p == "" {
			// The SDKs put the whole path in the part's file name, which
			// FileName() would cut to its base.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = params["filename"]
		}
		wi, err := s.writeOne(ctx, id, p, user, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, wi)
	}
}

func (s *Server) writeOne(ctx context.Context, id, p, user string, r io.Reader) (writeInfo, error) {
	p, err := s.resolve(ctx, id, p)
	if err != nil {
		return writeInfo{}, err
	}
	owner, err := s.owner(ctx, id, user)
	if err != nil {
		return writeInfo{}, err
	}
	if _, err := s.cfg.Node.WriteFile(ctx, id, p, r, backend.WriteOptions{MakeParents: true}); err != nil {
		return writeInfo{}, fmt.Errorf("write %s: %w", p, err)
	}
	if owner != nil {
		if err := s.cfg.Node.Chown(ctx, id, p, owner[0], owner[1]); err != nil {
			return writeInfo{}, fmt.Errorf("write %s: %w", p, err)
		}
	}
	return writeInfo{Name: path.Base(p), Type: "file", Path: p}, nil
}

// owner returns the uid and gid files made for user get (the sandbox's
// default user when empty), or nil for root: the node writes as root.
func (s *Server) owner(ctx context.Context, id, user string) (*[2]uint32, error) {
	if user == "" {
		sb, err := s.lookup(ctx, id)
		if err != nil {
			return nil, err
		}
		user = sb.User
	}
	switch user {
	case "", "root", "0", "0:0":
		return nil, nil
	}
	name, group, hasGroup := strings.Cut(user, ":")
	ids := [2]uint32{}
	uid, err := strconv.ParseUint(name, 10, 32)
	if err == nil {
		ids[0], ids[1] = uint32(uid), uint32(uid)
	} else {
		found := false
		s.passwd(ctx, id, func(f []string) bool {
			if f[0] != name || len(f) < 4 {
				return false
			}
			u, uerr := strconv.ParseUint(f[2], 10, 32)
			g, gerr := strconv.ParseUint(f[3], 10, 32)
			found = uerr == nil && gerr == nil
			ids[0], ids[1] = uint32(u), uint32(g)
			return true
		})
		if !found {
			return nil, errdefs.NotFound("user %q: not in the sandbox's /etc/passwd", name)
		}
	}
	if hasGroup {
		g, err := strconv.ParseUint(group, 10, 32)
		if err != nil {
			return nil, errdefs.InvalidArgument("user %q: the group must be a number", user)
		}
		ids[1] = uint32(g)
	}
	return &ids, nil
}
