package cli

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// The CLI's --json output is a stable interface: field names are the API's
// (snake_case: id, node_id, memory_bytes), lists are [] when empty, never
// null, and a field without a value (a nil pointer, a zero time) is left
// out. Durations are strings in the API's form ("90s", "0.250s"), times
// RFC 3339, sizes plain numbers of bytes. jsonView turns any value (the
// SDK's Go structs, which carry no JSON tags) into that form; a field's
// own json tag, where it has one, wins.

var (
	durationType = reflect.TypeOf(time.Duration(0))
	timeType     = reflect.TypeOf(time.Time{})
	marshaler    = reflect.TypeOf((*json.Marshaler)(nil)).Elem()
)

// jsonView returns v ready for encoding/json in the CLI's JSON form.
func jsonView(v any) any {
	if v == nil {
		return nil
	}
	out, _ := view(reflect.ValueOf(v))
	return out
}

// view converts v; ok is false for a value to leave out (nil pointer or
// interface, zero time).
func view(v reflect.Value) (any, bool) {
	switch {
	case v.Type() == durationType:
		return formatDuration(time.Duration(v.Int())), true
	case v.Type() == timeType:
		t := v.Interface().(time.Time)
		if t.IsZero() {
			return nil, false
		}
		return t.UTC().Format(time.RFC3339Nano), true
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil, false
		}
		if v.Kind() == reflect.Pointer && v.Type().Implements(marshaler) {
			return v.Interface(), true
		}
		return view(v.Elem())
	case reflect.Struct:
		if v.Type().Implements(marshaler) {
			return v.Interface(), true
		}
		obj := orderedObject{}
		addFields(&obj, v)
		return obj, true
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return v.Bytes(), true // base64, as in the API
		}
		fallthrough
	case reflect.Array:
		list := make([]any, 0, v.Len())
		for i := 0; i < v.Len(); i++ {
			e, ok := view(v.Index(i))
			if !ok {
				e = nil
			}
			list = append(list, e)
		}
		return list, true
	case reflect.Map:
		m := make(map[string]any, v.Len())
		it := v.MapRange()
		for it.Next() {
			if e, ok := view(it.Value()); ok {
				m[mapKey(it.Key())] = e
			}
		}
		return m, true
	}
	return v.Interface(), true
}

// addFields appends v's exported fields to obj; an embedded struct's
// fields are promoted, as encoding/json does.
func addFields(obj *orderedObject, v reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, omitEmpty := snakeCase(f.Name), false
		if tag, ok := f.Tag.Lookup("json"); ok {
			if tag == "-" {
				continue
			}
			n, opts, _ := strings.Cut(tag, ",")
			if n != "" {
				name = n
			}
			omitEmpty = strings.Contains(opts, "omitempty")
		}
		fv := v.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" {
			if fv.Kind() == reflect.Pointer {
				if fv.IsNil() {
					continue
				}
				fv = fv.Elem()
			}
			if fv.Kind() == reflect.Struct {
				addFields(obj, fv)
				continue
			}
		}
		if omitEmpty && fv.IsZero() {
			continue
		}
		if e, ok := view(fv); ok {
			*obj = append(*obj, field{name, e})
		}
	}
}

func mapKey(k reflect.Value) string {
	if k.Kind() == reflect.String {
		return k.String()
	}
	b, _ := json.Marshal(k.Interface())
	return strings.Trim(string(b), `"`)
}

// snakeCase turns a Go field name into the API's: NodeID -> node_id,
// CPUMillis -> cpu_millis, SandboxIDs -> sandbox_ids.
func snakeCase(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 {
			prev := r[i-1]
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower && !(i+2 == len(r) && r[i+1] == 's')) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// formatDuration writes d as protobuf's JSON form of a Duration: seconds
// with up to nine decimals and an "s".
func formatDuration(d time.Duration) string {
	s := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	return s + "s"
}

// orderedObject is a JSON object that keeps its fields in struct order.
type orderedObject []field

type field struct {
	name  string
	value any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		k, _ := json.Marshal(f.name)
		buf.Write(k)
		buf.WriteByte(':')
		val, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		buf.Write(val)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}
