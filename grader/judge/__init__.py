"""The trusted side: hidden tests as scenarios, the reference run, and the verdict on what a kernel sent."""
