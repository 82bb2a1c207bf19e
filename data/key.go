package data

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Key encoding. The processed bucket accepts keys of [-/_=.A-Za-z0-9] only,
// and job IDs may hold any bytes. A Key is injective over IDs:
//
//   - an ID of 1 to 128 characters from [A-Za-z0-9_-] is its own key, so
//     `nats kv get processed ID` works for the IDs people type;
//   - any other ID of up to maxEncodedID bytes is "=" and its unpadded
//     base64url encoding;
//   - a longer ID is "==" and the base64url SHA-256 of the ID.
//
// Plain keys never contain "=", and base64url never starts with "=", so the
// three forms cannot collide.
const (
	maxPlainID   = 128
	maxEncodedID = 512
)

// ErrBadKey is returned by IDFromKey for a key that no ID encodes to.
var ErrBadKey = errors.New("not a job key")

// Key returns the processed-bucket key of job id.
func Key(id string) string {
	switch {
	case isPlainID(id):
		return id
	case len(id) <= maxEncodedID:
		return "=" + base64.RawURLEncoding.EncodeToString([]byte(id))
	default:
		sum := sha256.Sum256([]byte(id))
		return "==" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
}

// IDFromKey returns the ID that key encodes. Hashed keys return ErrBadKey:
// their ID is kept in the record instead.
func IDFromKey(key string) (string, error) {
	switch {
	case strings.HasPrefix(key, "=="):
		return "", fmt.Errorf("%w: %q is a hashed key", ErrBadKey, key)
	case strings.HasPrefix(key, "="):
		b, err := base64.RawURLEncoding.DecodeString(key[1:])
		if err != nil || isPlainID(string(b)) || len(b) == 0 || len(b) > maxEncodedID {
			return "", fmt.Errorf("%w: %q", ErrBadKey, key)
		}
		return string(b), nil
	case isPlainID(key):
		return key, nil
	default:
		return "", fmt.Errorf("%w: %q", ErrBadKey, key)
	}
}

func isPlainID(id string) bool {
	if id == "" || len(id) > maxPlainID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
