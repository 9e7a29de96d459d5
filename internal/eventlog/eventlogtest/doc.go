// Package eventlogtest runs dynrunner's event log for tests on a real, in-process nats-server
// with JetStream in the test's temporary directory.
package eventlogtest
