package githubtest

import "time"

// The JSON shapes on the wire, written out here rather than borrowed from the client so that the
// tests check the client against an independent reading of the protocol.

type wireLabel struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type wireStatistics struct {
	TotalAvailableJobs     int `json:"totalAvailableJobs"`
	TotalAcquiredJobs      int `json:"totalAcquiredJobs"`
	TotalAssignedJobs      int `json:"totalAssignedJobs"`
	TotalRunningJobs       int `json:"totalRunningJobs"`
	TotalRegisteredRunners int `json:"totalRegisteredRunners"`
	TotalBusyRunners       int `json:"totalBusyRunners"`
	TotalIdleRunners       int `json:"totalIdleRunners"`
}

type wireRunnerSetting struct {
	DisableUpdate bool `json:"disableUpdate,omitempty"`
}

type wireScaleSet struct {
	ID                 int               `json:"id,omitempty"`
	Name               string            `json:"name,omitempty"`
	RunnerGroupID      int               `json:"runnerGroupId,omitempty"`
	RunnerGroupName    string            `json:"runnerGroupName,omitempty"`
	Labels             []wireLabel       `json:"labels,omitempty"`
	RunnerSetting      wireRunnerSetting `json:"RunnerSetting"`
	CreatedOn          time.Time         `json:"createdOn"`
	RunnerJitConfigURL string            `json:"runnerJitConfigUrl,omitempty"`
	Statistics         *wireStatistics   `json:"statistics,omitempty"`
}

type wireList[T any] struct {
	Count int `json:"count"`
	Value []T `json:"value"`
}

type wireRunnerGroup struct {
	ID        int    `json:"id"`
	Name      string `json:"name"`
	Size      int    `json:"size"`
	IsDefault bool   `json:"isDefaultGroup"`
}

type wireSession struct {
	SessionID               string          `json:"sessionId"`
	OwnerName               string          `json:"ownerName"`
	RunnerScaleSet          *wireScaleSet   `json:"runnerScaleSet"`
	MessageQueueURL         string          `json:"messageQueueUrl"`
	MessageQueueAccessToken string          `json:"messageQueueAccessToken"`
	Statistics              *wireStatistics `json:"statistics"`
}

// wireMessage is one message of the queue; Body is a JSON string holding an array of
// wireJobMessage.
type wireMessage struct {
	MessageID   int             `json:"messageId"`
	MessageType string          `json:"messageType"`
	Body        string          `json:"body"`
	Statistics  *wireStatistics `json:"statistics"`
}

// messageTypeJobMessages is the only queue message type the client accepts.
const messageTypeJobMessages = "RunnerScaleSetJobMessages"

// The job message types inside a message's body.
const (
	jobAvailable = "JobAvailable"
	jobAssigned  = "JobAssigned"
	jobStarted   = "JobStarted"
	jobCompleted = "JobCompleted"
)

type wireJobMessage struct {
	MessageType        string    `json:"messageType"`
	AcquireJobURL      string    `json:"acquireJobUrl,omitempty"`
	RunnerRequestID    int64     `json:"runnerRequestId"`
	RepositoryName     string    `json:"repositoryName"`
	OwnerName          string    `json:"ownerName"`
	JobID              string    `json:"jobId"`
	JobWorkflowRef     string    `json:"jobWorkflowRef"`
	JobDisplayName     string    `json:"jobDisplayName"`
	WorkflowRunID      int64     `json:"workflowRunId"`
	EventName          string    `json:"eventName"`
	RequestLabels      []string  `json:"requestLabels"`
	QueueTime          time.Time `json:"queueTime"`
	ScaleSetAssignTime time.Time `json:"scaleSetAssignTime"`
	RunnerAssignTime   time.Time `json:"runnerAssignTime"`
	FinishTime         time.Time `json:"finishTime"`
	RunnerID           int       `json:"runnerId,omitempty"`
	RunnerName         string    `json:"runnerName,omitempty"`
	Result             string    `json:"result,omitempty"`
}

type wireRunnerReference struct {
	ID               int    `json:"id"`
	Name             string `json:"name"`
	RunnerScaleSetID int    `json:"runnerScaleSetId"`
}

type wireJITConfig struct {
	Runner           *wireRunnerReference `json:"runner"`
	EncodedJITConfig string               `json:"encodedJITConfig"`
}

type wireAcquired struct {
	Count int     `json:"count"`
	Value []int64 `json:"value"`
}
