package httpapi

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/scripts"
)

// pins are what the installers the console serves trust: its URL, its
// serving key, its CA, and the Windows agent it serves.
func (s *server) pins() scripts.Pins {
	key, ca := s.PKI.KeyPin(), s.PKI.CAHash()
	p := scripts.Pins{ConsoleURL: s.ConsoleURL, KeyPin: base64.StdEncoding.EncodeToString(key[:]), CASHA256: hex.EncodeToString(ca[:])}
	if s.Downloads != nil {
		p.WindowsAgentSHA256, _ = s.Downloads.Sum(scripts.WindowsAgent)
	}
	return p
}

// installScript serves install.sh or install.ps1, filled in for this
// console. Boxes fetch it before they have any credentials.
func (s *server) installScript(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	if c.Request.URL.Path == "/install.ps1" {
		c.Data(http.StatusOK, "text/plain; charset=utf-8", []byte(scripts.InstallPs1(s.pins())))
		return
	}
	c.Data(http.StatusOK, "text/x-shellscript; charset=utf-8", []byte(scripts.InstallSh(s.pins())))
}

// download serves an agent binary or SHA256SUMS from the console's
// downloads directory.
func (s *server) download(c *gin.Context) {
	if s.Downloads == nil {
		fail(c, errNoDownloads)
		return
	}
	path, ok := s.Downloads.Path(c.Param("file"))
	if !ok {
		c.AbortWithStatusJSON(http.StatusNotFound, gin.H{"error": "no such download; this console serves " + list(s.Downloads.Files())})
		return
	}
	c.File(path)
}

func list(names []string) string {
	if len(names) == 0 {
		return "no agent binaries (build them with 'make dist' into the console's --dist directory)"
	}
	return strings.Join(names, ", ")
}

var errNoDownloads = errdefs.NotFound("this console serves no agent binaries (build them with 'make dist' into its --dist directory)")
