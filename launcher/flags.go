package launcher

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts the name of the environment variable behind each flag: --memory-mib
// defaults from DYNRUNNER_LAUNCH_MEMORY_MIB. The vm worker passes everything this way, which
// keeps the nonce out of the process list.
const EnvPrefix = "DYNRUNNER_LAUNCH_"

// EnvName returns the environment variable behind flag name ("memory-mib" ->
// "DYNRUNNER_LAUNCH_MEMORY_MIB").
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// The variables a worker sets for each launch: the instance and its nonce endpoint (EnvName of
// --instance-id, --nonce and --endpoint). The others are the same for every launch
// (Config.Environ).
const (
	EnvInstanceID = EnvPrefix + "INSTANCE_ID"
	EnvNonce      = EnvPrefix + "NONCE"
	EnvEndpoint   = EnvPrefix + "ENDPOINT"
)

type flagDef struct {
	name, usage string
	def         func(Config) string
	set         func(*Config, string) error
	// enc encodes the value for Environ when def does not (it shows defaults only).
	enc func(Config) string
}

// Environ encodes c as the DYNRUNNER_LAUNCH_* environment ParseFlags reads back: one variable
// per flag whose value in c is not empty. Unset instance, nonce and endpoint are left out, so
// a worker can add each launch's own to the settings of all launches.
func (c Config) Environ() map[string]string {
	return c.environ(func(string) bool { return true })
}

// InstanceEnv encodes the part of c that is one launch's own, as Environ does: InstanceID,
// Nonce and Endpoint (EnvInstanceID, EnvNonce, EnvEndpoint), each only when set. A worker
// adds it to the settings of all launches.
func (c Config) InstanceEnv() map[string]string {
	return c.environ(func(name string) bool { return name == "instance-id" || name == "nonce" || name == "endpoint" })
}

// environ is Environ of the flags keep names.
func (c Config) environ(keep func(flagName string) bool) map[string]string {
	env := map[string]string{}
	for _, d := range flagDefs {
		if !keep(d.name) {
			continue
		}
		enc := d.enc
		if enc == nil {
			enc = d.def
		}
		if v := enc(c); v != "" {
			env[EnvName(d.name)] = v
		}
	}
	return env
}

// shortDuration writes d as time.ParseDuration takes it, without the zero minutes and
// seconds of Duration.String: 6h, 90m as 1h30m.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func intFlag(name, usage string, field func(*Config) *int) flagDef {
	return flagDef{
		name: name, usage: usage,
		def: func(c Config) string { return strconv.Itoa(*field(&c)) },
		set: func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			if err != nil {
				return errors.New("want an integer")
			}
			*field(c) = n
			return nil
		},
	}
}

func stringFlag(name, usage string, field func(*Config) *string) flagDef {
	return flagDef{
		name: name, usage: usage,
		def: func(c Config) string { return *field(&c) },
		set: func(c *Config, s string) error { *field(c) = s; return nil },
	}
}

var flagDefs = []flagDef{
	{name: "instance-id", usage: "instance id: a UUID in canonical lowercase form (required)",
		def: func(Config) string { return "" },
		set: func(c *Config, s string) (err error) { c.InstanceID, err = ParseInstanceID(s); return err },
		enc: func(c Config) string {
			if c.InstanceID.IsZero() {
				return ""
			}
			return c.InstanceID.String()
		}},
	{name: "nonce", usage: "single-use nonce for the nonce endpoint, [A-Za-z0-9_-]{16,128} (required; prefer the environment variable)",
		def: func(Config) string { return "" },
		set: func(c *Config, s string) (err error) { c.Nonce, err = ParseNonce(s); return err },
		enc: func(c Config) string { return c.Nonce.Reveal() }},
	{name: "endpoint", usage: "nonce endpoint URL, http://<ip>:<port> on the bridge network (required)",
		def: func(Config) string { return "" },
		set: func(c *Config, s string) (err error) { c.Endpoint, err = ParseEndpoint(s); return err },
		enc: func(c Config) string { return c.Endpoint.String() }},
	stringFlag("image", "base image, qcow2 or raw: absolute path of a regular file (required)", func(c *Config) *string { return &c.Image }),
	stringFlag("kernel", "kernel for direct kernel boot (optional)", func(c *Config) *string { return &c.Kernel }),
	stringFlag("initramfs", "initramfs for direct kernel boot (optional, needs --kernel)", func(c *Config) *string { return &c.Initramfs }),
	stringFlag("cmdline", "kernel command line (optional, needs --kernel)", func(c *Config) *string { return &c.Cmdline }),
	stringFlag("firmware", "firmware that boots the disk (cloud-hypervisor without --kernel; -bios for qemu)", func(c *Config) *string { return &c.Firmware }),
	intFlag("cpus", "virtual CPUs", func(c *Config) *int { return &c.CPUs }),
	intFlag("memory-mib", "guest memory in MiB", func(c *Config) *int { return &c.MemoryMiB }),
	intFlag("disk-gib", "virtual size of the instance's qcow2 root disk in GiB", func(c *Config) *int { return &c.DiskGiB }),
	stringFlag("bridge", "bridge the TAP device joins (created when missing)", func(c *Config) *string { return &c.Bridge }),
	{name: "bridge-cidr", usage: "the bridge's own address and network; guests get addresses from it",
		def: func(c Config) string { return c.BridgeCIDR.String() },
		set: func(c *Config, s string) error {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return errors.New("want an IPv4 address with prefix length, like " + DefaultBridgeCIDR)
			}
			c.BridgeCIDR = p
			return nil
		},
		enc: func(c Config) string {
			if !c.BridgeCIDR.IsValid() {
				return ""
			}
			return c.BridgeCIDR.String()
		}},
	{name: "dns", usage: "comma-separated IPv4 name servers the guest resolves with (network-config nameservers; optional)",
		def: func(c Config) string { return JoinAddrs(c.DNS) },
		set: func(c *Config, s string) error {
			c.DNS = nil
			for _, f := range strings.Split(s, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				a, err := netip.ParseAddr(f)
				if err != nil || !a.Is4() {
					return errors.New("want IPv4 addresses separated by commas")
				}
				c.DNS = append(c.DNS, a)
			}
			return nil
		}},
	stringFlag("hypervisor", "cloud-hypervisor or qemu", func(c *Config) *string { return &c.Hypervisor }),
	{name: "deadline", usage: "the VM is killed when it runs longer (a Go duration)",
		def: func(c Config) string { return c.Deadline.String() },
		set: func(c *Config, s string) error {
			d, err := time.ParseDuration(s)
			if err != nil {
				return errors.New("want a duration like 6h or 90m")
			}
			c.Deadline = d
			return nil
		},
		enc: func(c Config) string {
			if c.Deadline == 0 {
				return ""
			}
			return shortDuration(c.Deadline)
		}},
	stringFlag("root", "parent of the instance directories (on ext4 or xfs: O_DIRECT is required)", func(c *Config) *string { return &c.Root }),
	stringFlag("console-log", "copy the guest's serial console log here at cleanup (optional)", func(c *Config) *string { return &c.ConsoleLog }),
}

// ParseFlags parses the launcher's command line. Each flag defaults from its environment
// variable (EnvName), read through getenv, then from DefaultConfig. Positional arguments are
// refused. The result is validated (Config.Validate). With -h it writes the usage to out and
// returns flag.ErrHelp.
func ParseFlags(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	base := DefaultConfig()
	fs := flag.NewFlagSet("dynrunner launcher", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: dynrunner launcher --instance-id UUID --nonce NONCE --endpoint URL --image PATH [flags]\n\n"+
			"Runs one single-use VM and removes everything it created when the VM ends.\n"+
			"Every flag also defaults from %s<FLAG>, e.g. %s.\n\n", EnvPrefix, EnvName("memory-mib"))
		fs.PrintDefaults()
	}
	vals := make([]*string, len(flagDefs))
	fromEnv := make([]bool, len(flagDefs))
	for i, d := range flagDefs {
		v := d.def(base)
		if e := getenv(EnvName(d.name)); e != "" {
			v, fromEnv[i] = e, true
		}
		usage := d.usage + " (env " + EnvName(d.name) + ")"
		if d.name == "nonce" {
			vals[i] = new(string)
			*vals[i] = v
			fs.Func(d.name, usage, func(s string) error { *vals[i] = s; return nil }) // no default shown
			continue
		}
		vals[i] = fs.String(d.name, v, usage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, invalidf("%v", err)
	}
	if fs.NArg() > 0 {
		return Config{}, invalidf("unexpected argument %q", clip(fs.Arg(0)))
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c := base
	for i, d := range flagDefs {
		v := *vals[i]
		if v == "" && !set[d.name] {
			continue // not given: keep the default (the required ones fail in Validate)
		}
		if err := d.set(&c, v); err != nil {
			src := "--" + d.name
			if fromEnv[i] && !set[d.name] {
				src = EnvName(d.name)
			}
			if errors.Is(err, ErrInvalidConfig) {
				return Config{}, err // already says what it refused
			}
			if d.name == "nonce" {
				return Config{}, invalidf("%s: %v", src, err)
			}
			return Config{}, invalidf("%s %q: %v", src, clip(v), err)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// JoinAddrs writes addresses as --dns (DYNRUNNER_LAUNCH_DNS) takes them.
func JoinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}
