package redis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"github.com/redis/rueidis"

	limiterredis "github.com/ratelimiter/ratelimiter/internal/limiter/redis"
)

// The server-side scripts. Each is the limiter Store's arithmetic library,
// then tenant.lua, then its own code: a script cannot load another. Each
// runs atomically on the server holding its shard; rueidis sends EVALSHA
// and falls back to EVAL when the server answers NOSCRIPT.
var (
	//go:embed lua/tenant.lua
	tenantLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/available.lua
	availableLua string
	//go:embed lua/lowest.lua
	lowestLua string

	acquireScript = rueidis.NewLuaScript(script(acquireLua))
	// availableScript writes nothing, so it runs as EVALSHA_RO / EVAL_RO.
	availableScript = rueidis.NewLuaScriptReadOnly(script(availableLua))
	// lowestScript trims expired index members, so it is not read-only.
	lowestScript = rueidis.NewLuaScript(script(lowestLua))
	// lowestSHA is what Lowest pipelines to every shard at once, falling
	// back to lowestScript.Exec for a shard whose server answers NOSCRIPT.
	lowestSHA = sha1Hex(script(lowestLua))
)

func script(own string) string {
	return limiterredis.Library() + "\n" + tenantLua + "\n" + own
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
