package opensandbox

// The parts of the Lifecycle API's schemas (specs/sandbox-lifecycle.yml) the backend sends and
// reads. Fields the backend does not need (expiresAt, image in answers) are not decoded, and
// createdAt is kept as text, so a server's date format can never break it.

// Paths of the API, relative to the server URL.
const pathSandboxes = "/sandboxes"

// apiKeyHeader carries the API key (components.securitySchemes.apiKeyAuth).
const apiKeyHeader = "OPEN-SANDBOX-API-KEY"

// requestIDHeader is the server's tracing id of a request (components.headers.XRequestId).
const requestIDHeader = "X-Request-ID"

// The extensions key that makes the server create the sandbox from a pre-warmed pool.
const extensionPoolRef = "poolRef"

// Sandbox states (components.schemas.SandboxState). New states may appear; the backend treats
// a state it does not know as still alive.
const (
	StatePending    = "Pending"
	StateRunning    = "Running"
	StatePausing    = "Pausing"
	StatePaused     = "Paused"
	StateStopping   = "Stopping"
	StateTerminated = "Terminated"
	StateFailed     = "Failed"
)

// imageSpec is components.schemas.ImageSpec.
type imageSpec struct {
	URI string `json:"uri"`
}

// createRequest is components.schemas.CreateSandboxRequest.
type createRequest struct {
	Image          *imageSpec        `json:"image,omitempty"`
	Timeout        int               `json:"timeout"`
	ResourceLimits map[string]string `json:"resourceLimits"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	Entrypoint     []string          `json:"entrypoint"`
	Extensions     map[string]string `json:"extensions"`
}

// sandboxStatus is components.schemas.SandboxStatus.
type sandboxStatus struct {
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// sandbox is components.schemas.Sandbox and CreateSandboxResponse (id, status, metadata).
type sandbox struct {
	ID       string            `json:"id"`
	Status   sandboxStatus     `json:"status"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// CreatedAt is a date-time; older reads it when it parses.
	CreatedAt string `json:"createdAt,omitempty"`
}

// paginationInfo is components.schemas.PaginationInfo.
type paginationInfo struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

// listResponse is components.schemas.ListSandboxesResponse.
type listResponse struct {
	Items      []sandbox       `json:"items"`
	Pagination *paginationInfo `json:"pagination"`
}

// errorResponse is components.schemas.ErrorResponse, the body of every non-2xx answer.
type errorResponse struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ended reports whether state is final: the sandbox will not run again.
func ended(state string) bool { return state == StateTerminated || state == StateFailed }

// going reports whether the sandbox is ending or has ended.
func going(state string) bool { return ended(state) || state == StateStopping }
