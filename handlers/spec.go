package handlers

import (
	"errors"
	"fmt"
	"strings"

	"github.com/rs/zerolog"
)

const (
	// specKinds is the expected form of a handler spec, for errors.
	specKinds = "want log, exec:COMMAND or http:URL"
	// routeForm is the expected form of a handler route, for errors.
	routeForm = "want SUBJECT=SPEC, e.g. job.email=exec:./send.sh"
	// httpExample shows an http spec, for errors.
	httpExample = "want http:URL, e.g. http:http://127.0.0.1:9000/hook"
)

// ParseSpec returns the handler that spec names, after trimming surrounding
// whitespace:
//
//   - "log": Log(log);
//   - "exec:COMMAND": Exec(COMMAND, ExecOptions{}), COMMAND trimmed and not
//     empty;
//   - "http:URL": HTTP(URL, nil), URL an absolute http:// or https:// URL
//     with a host, e.g. "http:https://example.com/hook".
//
// Its errors are one line that says what is wrong and what was expected, and
// never show a URL's user info or query.
func ParseSpec(spec string, log zerolog.Logger) (Handler, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("empty handler spec: %s", specKinds)
	}
	kind, arg, hasArg := strings.Cut(spec, ":")
	switch kind {
	case "log":
		if hasArg {
			return nil, errors.New(`handler "log" takes no argument: want log`)
		}
		return Log(log), nil
	case "exec":
		command := strings.TrimSpace(arg)
		if command == "" {
			return nil, errors.New(`handler "exec" needs a command: want exec:COMMAND, e.g. exec:./send.sh`)
		}
		return Exec(command, ExecOptions{}), nil
	case "http", "https":
		raw := strings.TrimSpace(arg)
		if strings.HasPrefix(raw, "//") {
			return nil, fmt.Errorf(`handler spec is a bare URL: put "http:" before it, %s`, httpExample)
		}
		if kind == "https" {
			break
		}
		if raw == "" {
			return nil, fmt.Errorf(`handler "http" needs a URL: %s`, httpExample)
		}
		if _, err := parseHookURL(raw); err != nil {
			return nil, fmt.Errorf(`handler "http": %s: %s`, oneLine(err.Error()), httpExample)
		}
		return HTTP(raw, nil), nil
	}
	return nil, fmt.Errorf("unknown handler kind %q: %s", kind, specKinds)
}

// ParseRoute splits s, of the form SUBJECT=SPEC, at its first '=' into a
// subject pattern and a handler spec, both trimmed. The pattern must be valid
// for Router.Handle and able to match subjects under "job.": its first token
// is "job" or "*" with more tokens after it, or it is ">". The spec must not
// be empty; ParseSpec checks the rest. Errors are one line ending in the
// expected form.
func ParseRoute(s string) (pattern, spec string, err error) {
	pattern, spec, ok := cutRoute(s)
	if !ok {
		return "", "", fmt.Errorf(`handler route has no "=": %s`, routeForm)
	}
	pattern, spec = strings.TrimSpace(pattern), strings.TrimSpace(spec)
	if pattern == "" {
		return "", "", fmt.Errorf("handler route has an empty subject: %s", routeForm)
	}
	if reason := patternProblem(pattern); reason != "" {
		return "", "", fmt.Errorf("invalid handler subject %q: %s: %s", pattern, reason, routeForm)
	}
	if !matchesJobs(pattern) {
		return "", "", fmt.Errorf(`handler subject %q matches no subject under "job.": %s`, pattern, routeForm)
	}
	if spec == "" {
		return "", "", fmt.Errorf("handler route for %q has an empty spec: %s", pattern, routeForm)
	}
	return pattern, spec, nil
}

// cutRoute cuts a route at its first "=" that a handler spec follows
// (log, exec:, http:, https:), so that a subject with "=" in it, which NATS
// takes, can have a route of its own; with none such, at its first "=",
// for ParseSpec to say what is wrong with the spec.
func cutRoute(s string) (pattern, spec string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != '=' {
			continue
		}
		kind, _, _ := strings.Cut(strings.TrimSpace(s[i+1:]), ":")
		switch kind {
		case "log", "exec", "http", "https":
			return s[:i], s[i+1:], true
		}
	}
	return strings.Cut(s, "=")
}

// matchesJobs reports whether the valid pattern can match a subject under
// "job.".
func matchesJobs(pattern string) bool {
	if pattern == ">" {
		return true
	}
	first, rest, more := strings.Cut(pattern, ".")
	return more && rest != "" && (first == "job" || first == "*")
}
