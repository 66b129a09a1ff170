// Command edgebox-console runs the edgebox console: the HTTP API, the
// enrollment endpoint and the tunnel server on one TLS port.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/edgebox/edgebox/console"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "edgebox-console:", err)
		os.Exit(1)
	}
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func run() error {
	cfg := console.DefaultConfig()
	fs := flag.NewFlagSet("edgebox-console", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: edgebox-console [flags]

Runs the edgebox console. On first start it creates its certificate
authority and an admin API token in the data directory and prints the token
once.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.DataDir, "data", cfg.DataDir, "data directory (database, and the CA unless --shared)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "the one public address: tunnel, API and enrollment")
	fs.StringVar(&cfg.PublicURL, "public-url", "", "URL boxes and operators use to reach this console (default https://<hostname>:<port>)")
	fs.StringVar(&cfg.Store, "store", "", "where the console's records live: the database in --data (default), or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] for an etcd cluster (the CA, registry and recordings stay in --data, or --shared)")
	fs.StringVar(&cfg.SharedDir, "shared", "", "absolute path of a directory every console replica on the same etcd mounts, such as NFS with working file locks (NFSv4, or v3 with lockd): the CA and serving key, registry, agent releases and recordings live there instead of in --data, and replicas starting at once make one CA between them (default: everything in --data)")
	fs.StringVar(&cfg.RegistryS3, "registry-s3", "", "keep the registry's images in an S3-compatible bucket instead of --shared (or --data): s3://BUCKET[/PREFIX]?region=REGION for Amazon S3, or s3://BUCKET[/PREFIX]?endpoint=https://HOST:PORT for another store (path-style addressing; add path-style=false for virtual hosts). Credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials")
	var hosts, also listFlag
	fs.StringVar(&cfg.ReplicaListen, "replica-listen", "", "with --store etcd://: the address the other console replicas forward calls for this one's boxes to, over mutual TLS with certificates of the console CA (default :8444; 'off' runs none)")
	fs.StringVar(&cfg.ReplicaURL, "replica-url", "", "how the other replicas reach --replica-listen, https://HOST:PORT (default https://<hostname>:<its port>)")
	fs.Var(&also, "also-addr", "another HOST:PORT boxes may reach this console at, such as a replica's own address where no one name or load balancer reaches them all; enrollment tokens carry it (repeatable, at most 8)")
	fs.Var(&hosts, "host", "another name or address for the serving certificate (repeatable)")
	fs.StringVar(&cfg.DistDir, "dist", "", "directory of agent binaries served to installing boxes (default <data>/dist; 'make dist' fills dist/)")
	fs.DurationVar(&cfg.BoxCertTTL, "box-cert-ttl", cfg.BoxCertTTL, "lifetime of box certificates; boxes renew at two thirds")
	fs.IntVar(&cfg.Admission.Max, "box-admission-max", cfg.Admission.Max,
		"most box sessions let in at once between their TLS handshake and their caught-up sync; the console adapts its limit below this to how fast it completes them")
	fs.DurationVar(&cfg.Admission.Target, "box-admission-target", cfg.Admission.Target,
		"how long a box session may take from its TLS handshake to its caught-up sync before the console lets in fewer at once; shorter keeps the API quicker under a reconnect storm, longer lets in more at once")
	fs.DurationVar(&cfg.Admission.CPUWait, "box-admission-cpu-wait", cfg.Admission.CPUWait,
		"let in fewer box sessions at once while the console's goroutines wait longer than this for the CPU (0: only the sessions' own times count)")
	fs.DurationVar(&cfg.Admission.RejoinMax, "box-rejoin-max", cfg.Admission.RejoinMax,
		"the longest window the console tells its boxes to spread their return over after a restart, so a fleet it cannot greet at once comes back at the pace it greets them (0: tell none, and each box keeps its own few seconds)")
	fs.IntVar(&cfg.GCPace.Percent, "storm-gogc", cfg.GCPace.Percent,
		"the Go collector's GOGC while box sessions are held back in a reconnect storm, so the heap may grow further between collections and the console spends less of its CPU on them (0: keep the usual pace; a GOGC in the environment always wins, and GOMEMLIMIT bounds the heap)")
	fs.DurationVar(&cfg.SessionIdleTimeout, "session-idle-timeout", 30*time.Minute, "end a remote shell or command with no byte either way for this long")
	fs.DurationVar(&cfg.SessionMaxDuration, "session-max-duration", 8*time.Hour, "end every remote shell or command after this long")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	if *version {
		fmt.Println(console.Version)
		return nil
	}
	cfg.ExtraHosts = hosts
	switch {
	case cfg.ReplicaListen == "off":
		cfg.ReplicaListen = ""
	case cfg.ReplicaListen == "" && cfg.Store != "":
		cfg.ReplicaListen = ":8444"
	}
	cfg.AlsoAddrs = also
	// A smaller ceiling lowers where the limit starts and its floor too.
	cfg.Admission.Initial = min(cfg.Admission.Initial, cfg.Admission.Max)
	cfg.Admission.Min = min(cfg.Admission.Min, cfg.Admission.Initial)
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level %q: %v", *level, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	c, err := console.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		time.AfterFunc(15*time.Second, func() { log.Error("shutdown took too long; exiting"); os.Exit(1) })
	}()
	return c.Run(ctx)
}
