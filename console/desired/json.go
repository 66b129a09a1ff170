package desired

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// FromJSON builds an object of kind named name from its spec in protobuf
// JSON. Unknown fields are an error, so a typo never passes silently.
func FromJSON(kind, name string, spec []byte) (*edgeboxv1.DesiredObject, error) {
	o := &edgeboxv1.DesiredObject{Name: name, Kind: kind}
	var m proto.Message
	switch kind {
	case edgeboxv1.KindWorkload:
		w := &edgeboxv1.Workload{}
		m, o.Spec = w, &edgeboxv1.DesiredObject_Workload{Workload: w}
	case edgeboxv1.KindUsbAssignment:
		u := &edgeboxv1.UsbAssignment{}
		m, o.Spec = u, &edgeboxv1.DesiredObject_UsbAssignment{UsbAssignment: u}
	case edgeboxv1.KindAgentConfig:
		c := &edgeboxv1.AgentConfig{}
		m, o.Spec = c, &edgeboxv1.DesiredObject_AgentConfig{AgentConfig: c}
	case edgeboxv1.KindAgentRelease:
		r := &edgeboxv1.AgentRelease{}
		m, o.Spec = r, &edgeboxv1.DesiredObject_AgentRelease{AgentRelease: r}
	default:
		return nil, errdefs.Invalid("unknown kind %q: use %s, %s, %s or %s", kind, edgeboxv1.KindWorkload, edgeboxv1.KindUsbAssignment, edgeboxv1.KindAgentConfig, edgeboxv1.KindAgentRelease)
	}
	if err := protojson.Unmarshal(spec, m); err != nil {
		return nil, errdefs.Invalid("%s spec: %w", kind, err)
	}
	return o, nil
}

// SpecJSON returns an object's spec in protobuf JSON; a tombstone's is null.
func SpecJSON(o *edgeboxv1.DesiredObject) ([]byte, error) {
	var m proto.Message
	switch s := o.GetSpec().(type) {
	case *edgeboxv1.DesiredObject_Workload:
		m = s.Workload
	case *edgeboxv1.DesiredObject_UsbAssignment:
		m = s.UsbAssignment
	case *edgeboxv1.DesiredObject_AgentConfig:
		m = s.AgentConfig
	case *edgeboxv1.DesiredObject_AgentRelease:
		m = s.AgentRelease
	default:
		return []byte("null"), nil
	}
	return protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
}
