use crate::testimage::Image;
use crate::*;

fn run(img: &Image, repair: bool) -> (Report, Vec<u8>) {
    let dev = img.device();
    let r = check(&dev, CheckOptions { repair, progress: None }).expect("check runs");
    (r, dev.to_bytes())
}

#[test]
fn fresh_and_populated_images_are_clean() {
    for img in [Image::small(), Image::populated()] {
        let (r, _) = run(&img, false);
        assert!(r.is_clean(), "{:#?}", r.findings);
        assert_eq!(r.exit_code(), 0);
    }
}
