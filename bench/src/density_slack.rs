//! `lull bench density --timer-slack LIST`: the user-irqchip modes run once per slack, one
//! row each (`pull@1ms`); the kernel and QEMU modes once.

use super::density::{DensityArgs, Mode};

impl DensityArgs {
    /// The slacks `mode` runs with: each of `--timer-slack` for a user-irqchip mode, else
    /// none (one run without the flag).
    pub fn slacks_of(&self, mode: Mode) -> Vec<Option<&str>> {
        let user = !mode.is_qemu() && mode != Mode::Kernel;
        if user && !self.timer_slack.is_empty() {
            self.timer_slack.iter().map(|s| Some(s.as_str())).collect()
        } else {
            vec![None]
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use timer::ModelKind;

    use super::*;
    use crate::report;

    /// `lull bench density`'s flags alone.
    #[derive(Debug, Parser)]
    struct Density {
        #[command(flatten)]
        args: DensityArgs,
    }

    #[test]
    fn each_slack_is_a_row_of_the_user_modes_only() {
        let d = Density::try_parse_from(["density", "--timer-slack", "off,100us,1ms"]).unwrap();
        let a = d.args;
        assert_eq!(a.timer_slack, ["off", "100us", "1ms"]);
        assert_eq!(
            a.slacks_of(Mode::User(ModelKind::Pull)),
            [Some("off"), Some("100us"), Some("1ms")]
        );
        assert_eq!(a.slacks_of(Mode::User(ModelKind::Push)).len(), 3);
        assert_eq!(a.slacks_of(Mode::Kernel), [None]);
        assert_eq!(a.slacks_of(Mode::QemuOn), [None]);
        let none = Density::try_parse_from(["density"]).unwrap().args;
        assert_eq!(none.slacks_of(Mode::User(ModelKind::Pull)), [None]);
        assert!(Density::try_parse_from(["density", "--timer-slack", "100"]).is_err());
        assert!(Density::try_parse_from(["density", "--timer-slack", "soon"]).is_err());
    }

    #[test]
    fn a_row_with_slack_is_labelled_by_it() {
        let mut r = report::tests::density_row("pull", 4, 1.0);
        assert_eq!(r.label(), "pull");
        r.timer_slack = Some("1ms".into());
        assert_eq!(r.label(), "pull@1ms");
        assert!(report::density_line(&r).starts_with("pull@1ms        4"));
    }
}
