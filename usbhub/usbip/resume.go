package usbip

import (
	"context"
	"net"
	"time"

	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// importResumable answers OP_REQ_IMPORT_RESUMABLE: an import, whose
// session is held when its connection drops, for a resume within the
// server's window.
func (s *Server) importResumable(ctx context.Context, c net.Conn, busID string, id sessionID) {
	ss, status, why := s.take(busID, &id)
	if ss == nil {
		s.log.Info("a USB/IP client asked for a device not offered, or in use", "remote", c.RemoteAddr(), "busid", busID, "why", why)
		c.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.Write(appendOpHeader(nil, opRepImportResumable, status))
		return
	}
	s.log.Info("a USB/IP client imported a device, resumably", "remote", c.RemoteAddr(), "busid", busID)
	reply := appendDevice(appendOpHeader(nil, opRepImportResumable, stOK), ss.e.busID, busnum, ss.e.devnum, ss.e.dev.Info(), false)
	ss.serve(ctx, c, func() []byte { return reply }, appendOpHeader(nil, opRepImportResumable, stNA))
}

// resume answers OP_REQ_RESUME: the session named carries on over c,
// which takes it from the connection it had, if any.
func (s *Server) resume(ctx context.Context, c net.Conn, id sessionID, waiting []uint32) {
	s.mu.Lock()
	ss := s.byID[id]
	s.mu.Unlock()
	refusal := appendOpHeader(nil, opRepResume, stNoSession)
	if ss == nil {
		s.log.Info("a USB/IP client asked to resume a session that is not, or no longer, held", "remote", c.RemoteAddr())
		c.SetWriteDeadline(time.Now().Add(writeTimeout))
		c.Write(refusal)
		return
	}
	s.log.Info("a USB/IP client resumes a session", "remote", c.RemoteAddr(), "busid", ss.e.busID, "waiting", len(waiting))
	info := ss.e.dev.Info()
	ss.serve(ctx, c, func() []byte { return ss.resumeReply(info, waiting) }, refusal)
}

// resumeReply answers a resume whose client waits for the URBs waiting,
// and keeps only their replies; hold ss.mu and ss.wmu. URBs it does not
// name were answered, or unlinked: those still running are cancelled,
// and the replies of the others dropped.
func (ss *session) resumeReply(info usbdev.Info, waiting []uint32) []byte {
	want := make(map[uint32]bool, len(waiting))
	for _, seq := range waiting {
		want[seq] = true
	}
	for seq, cancel := range ss.inflight {
		if !want[seq] {
			cancel()
			delete(ss.inflight, seq)
		}
	}
	var resend []keptReply
	kept := map[uint32]bool{}
	for _, k := range ss.kept {
		if want[k.seqnum] {
			resend = append(resend, k)
			kept[k.seqnum] = true
		}
	}
	ss.kept = resend
	states := make([]uint32, len(waiting))
	for i, seq := range waiting {
		_, running := ss.inflight[seq]
		switch {
		case running || kept[seq]:
			states[i] = resumeAnswered
		case ss.seen && !after(seq, ss.last):
			states[i] = resumeLost
		default:
			states[i] = resumeResubmit
		}
	}
	b := appendDevice(appendOpHeader(nil, opRepResume, stOK), ss.e.busID, busnum, ss.e.devnum, info, false)
	b = appendResumeStates(b, waiting, states)
	for _, k := range resend {
		b = append(b, k.reply...)
	}
	return b
}
