package audit

import (
	"encoding/binary"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/db"
)

// AppendTx records e in the bbolt bucket of older consoles. It goes when
// fleet writes to the store.
func AppendTx(tx *bolt.Tx, now time.Time, e Entry) error {
	b := tx.Bucket(db.Audit)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	e.Seq, e.Time = seq, now.UTC()
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(nil, seq), v)
}
