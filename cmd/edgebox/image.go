package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/images/vm"
)

// imageCmd is 'edgebox image push-disk'.
func imageCmd() *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Put images into the console's registry"}
	var files vm.Files
	var cfg vm.Config
	var memory string
	push := &cobra.Command{
		Use:   "push-disk [DISK.qcow2] REPO:TAG",
		Short: "Push a VM image (a qcow2 disk, or a kernel and initrd) to the console's registry",
		Long: `Push a VM image to the console's registry as an OCI artifact, for releases with
--runtime qemu. Every box that runs it starts from a fresh overlay of this
disk. REPO:TAG is in the console's registry unless it names another host.
Container images are pushed with docker, crane or oras and your API token.`,
		Example: "  edgebox image push-disk win10-icbc.qcow2 robots/icbc-vm:2.1\n" +
			"  edgebox image push-disk --kernel vmlinuz --initrd initrd.img --cmdline 'console=ttyS0' tiny/linux:1",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				files.Disk = args[0]
			}
			var err error
			if cfg.MemoryBytes, err = parseBytes(memory); err != nil {
				return err
			}
			conf, err := loadConfig()
			if err != nil {
				return err
			}
			u, err := url.Parse(conf.Console)
			if err != nil {
				return err
			}
			target := args[len(args)-1]
			if first, _, _ := strings.Cut(target, "/"); !strings.ContainsAny(first, ".:") && first != "localhost" {
				target = u.Host + "/" + target
			}
			ref, err := name.ParseReference(target)
			if err != nil {
				return fmt.Errorf("%q: %v", args[len(args)-1], err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(conf.CAPEM)) {
				return errors.New("no console CA stored; run 'edgebox login'")
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = &tls.Config{RootCAs: pool}
			updates := make(chan v1.Update, 16)
			done := make(chan struct{})
			go func() {
				defer close(done)
				last := time.Time{}
				for u := range updates {
					if time.Since(last) > time.Second && u.Total > 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "  %d of %d MiB\n", u.Complete>>20, u.Total>>20)
						last = time.Now()
					}
				}
			}()
			d, err := vm.Push(ref, files, cfg, remote.WithTransport(tr), remote.WithContext(cmd.Context()),
				remote.WithAuth(&authn.Basic{Username: "edgebox", Password: conf.Token}), remote.WithProgress(updates))
			<-done
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s@%s\n", ref.Context().Name(), d)
			return nil
		},
	}
	f := push.Flags()
	f.StringVar(&files.Kernel, "kernel", "", "kernel to boot directly")
	f.StringVar(&files.Initrd, "initrd", "", "initrd for --kernel")
	f.StringVar(&cfg.Cmdline, "cmdline", "", "kernel command line for --kernel")
	f.StringVar(&memory, "memory", "", "the VM's memory unless its release says: 2Gi")
	f.IntVar(&cfg.CPUs, "cpus", 0, "the VM's CPUs unless its release says")
	c.AddCommand(push)
	return c
}
